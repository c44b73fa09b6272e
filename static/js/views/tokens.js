// The prompt as token chips: display text, ID below, character span on hover.
import { el, showToken } from "../dom.js";

export function renderTokens(container, run, onSelect) {
  container.replaceChildren();
  for (const t of run.tokens) {
    const kind = t.special ? " special" : t.partial ? " partial" : "";
    const what = t.special ? "special token, covers no text"
      : t.partial && t.start === t.end ? "bytes of a character the next tokens complete"
      : t.partial ? `characters ${t.start}–${t.end}, then bytes of a character the next tokens complete`
      : `characters ${t.start}–${t.end}`;
    const chip = el("button", {
      type: "button",
      class: `token${kind}`,
      title: `token ${t.index} · id ${t.id} · ${what}`,
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
