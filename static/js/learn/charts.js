// Small helpers shared by the Learn views: token axes, stage and head names, pickers (their
// charts are drawn by ../chart.js, labels escaped: token text is untrusted).
import { label } from "../chart.js";

export function tokenAxis(tokens, max = 40, offset = 0) {
  const step = Math.max(1, Math.ceil(tokens.length / max));
  const tickvals = tokens.map((_, i) => i + offset).filter((i) => (i - offset) % step === 0);
  return { tickvals, ticktext: tickvals.map((i) => label(tokens[i - offset])), tickangle: -50, automargin: true };
}

// "layer 2 head 5" in the current language
// The first stage's name: "embedding + position" when the model adds a position vector to the
// embedding (learned, sinusoidal), plain "embedding" when position enters inside attention
// (rotary, ALiBi) or nowhere. `model` is an entry of /api/models.
export const addsPosition = (model) => model.position_encoding === "learned" || model.position_encoding === "sinusoidal";
export const embedStage = (t, model) => t(addsPosition(model) ? "positions.stage.embed" : "positions.stage.embed_only");
export const headName = (t, layer, head) => t("common.layer_head", { layer, head });

// A select filled with count options labelled by fn(i); keeps its value across repaints.
export function fillOptions(select, count, fn) {
  const keep = select.value;
  select.replaceChildren(...Array.from({ length: count }, (_, i) => {
    const o = document.createElement("option");
    o.value = String(i);
    o.textContent = fn(i);
    return o;
  }));
  if (keep !== "") select.value = keep;
}
