// A plain note when the prompt is Chinese: how the tokenizer cut it, and how well the model
// predicts it (the mean probability of the true next token, measured on this run).
import { fmt } from "../dom.js";
import { sentences, t } from "../i18n.js";

const HAN = /\p{Script=Han}/gu;

export function chineseNote(box, run, text) {
  const chars = (text.match(HAN) || []).length;
  if (!chars) {
    box.hidden = true;
    box.textContent = "";
    return;
  }
  // tokens that hold Chinese text; byte pieces (partial characters) when there are more
  // tokens than characters or a token is marked partial
  const han = run.tokens.filter((x) => x.partial || /\p{Script=Han}/u.test(text.slice(x.start, x.end)) || /\p{Script=Han}/u.test(x.text));
  const pieces = han.length > chars || run.tokens.some((x) => x.partial);
  const scored = run.predictions.filter((p) => p.actual_next);
  const mean = scored.length ? scored.reduce((a, p) => a + p.actual_next.prob, 0) / scored.length : null;
  const parts = [t(pieces ? "note.zh.bytes" : "note.zh.whole", { chars, tokens: han.length })];
  if (mean !== null) parts.push(t(mean < 0.2 ? "note.zh.weak" : "note.zh.ok", { p: fmt(mean, 3) }));
  box.textContent = sentences(parts);
  box.hidden = false;
}
