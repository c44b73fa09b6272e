// A view drawn almost white on the linear scale (a diffuse head; an exact zoom into one) says so beside
// the colour menu, naming the largest weight in view and the scales that show it.
import { $ } from "../dom.js";
import { onLanguage, t } from "../i18n.js";

function show() {
  const div = $("#heatmap");
  const hint = $("#colour-hint");
  const faint = div.dataset.faint === "true";
  hint.hidden = !faint;
  hint.textContent = faint ? t("x.colour.faint", { peak: Number(div.dataset.peak).toPrecision(2) }) : "";
}

export function watchFaint() {
  new MutationObserver(show).observe($("#heatmap"), { attributes: true, attributeFilter: ["data-faint", "data-peak"] });
  onLanguage(show);
}
