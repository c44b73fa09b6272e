// The prompt as token chips: display text, ID below, character span on hover.
import { el, showToken } from "../dom.js";

export function renderTokens(container, run, onSelect) {
  container.replaceChildren();
  for (const t of run.tokens) {
    const special = t.start === t.end;
    const chip = el("button", {
      type: "button",
      class: special ? "token special" : "token",
      title: `token ${t.index} · id ${t.id} · characters ${t.start}–${t.end}`,
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
