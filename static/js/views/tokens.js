// The prompt as token chips: display text, ID below, character span on hover.
import { el, showToken } from "../dom.js";
import { t as tr } from "../i18n.js";

export function renderTokens(container, run, onSelect) {
  container.replaceChildren();
  for (const t of run.tokens) {
    const kind = t.special ? " special" : t.partial ? " partial" : "";
    const what = t.special ? tr("x.chip.special")
      : t.partial && t.start === t.end ? tr("x.chip.bytes")
      : t.partial ? tr("x.chip.chars_then_bytes", { start: t.start, end: t.end })
      : tr("x.chip.chars", { start: t.start, end: t.end });
    const chip = el("button", {
      type: "button",
      class: `token${kind}`,
      title: tr("x.chip.title", { i: t.index, id: t.id, what }),
      dataset: { testid: "token", index: String(t.index) },
      onclick: () => onSelect(t.index),
    },
    el("span", { class: "t", text: showToken(t.text) }),
    el("span", { class: "id", text: String(t.id) }));
    container.append(chip);
  }
}

export function markSelected(container, pos) {
  for (const chip of container.querySelectorAll(".token")) {
    chip.classList.toggle("selected", Number(chip.dataset.index) === pos);
  }
  const current = container.querySelector(".token.selected");
  if (current) current.scrollIntoView({ block: "nearest", inline: "nearest" });
}
