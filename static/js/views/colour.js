// White -> deep blue, the scale shared by the heatmap, thumbnails and charts.
export const SCALE = [
  [0, "#ffffff"], [0.1, "#e3eef9"], [0.25, "#b7d4ea"], [0.45, "#6baed6"], [0.7, "#2171b5"], [1, "#08306b"],
];

const STOPS = SCALE.map(([t, hex]) => [t, parseInt(hex.slice(1, 3), 16), parseInt(hex.slice(3, 5), 16), parseInt(hex.slice(5, 7), 16)]);

// The masked (causal future) cell: app.css's --masked grey and --mask-hatch stripes, the one definition.
export function maskColours() {
  const style = getComputedStyle(document.documentElement);
  return { fill: style.getPropertyValue("--masked").trim(), hatch: style.getPropertyValue("--mask-hatch").trim() };
}

// "#rrggbb" -> [r, g, b]
export const hexRGB = (hex) => [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16));

export function rgb(t) {
  const x = Math.min(1, Math.max(0, t));
  for (let i = 1; i < STOPS.length; i++) {
    if (x <= STOPS[i][0]) {
      const [t0, r0, g0, b0] = STOPS[i - 1];
      const [t1, r1, g1, b1] = STOPS[i];
      const f = (x - t0) / (t1 - t0 || 1);
      return [r0 + f * (r1 - r0), g0 + f * (g1 - g0), b0 + f * (b1 - b0)];
    }
  }
  return STOPS[STOPS.length - 1].slice(1);
}

// The heatmap's colour scales: "linear" (0 to 1), "sqrt" (0 to 1 on a square-root scale: small weights
// of a long prompt show) and "view" (0 to the largest weight in view: a diffuse head, or an exact zoom
// into one, is not all white). ``scaleFor`` -> { map(v), zmax, colorbar } for a view whose largest weight
// is ``peak``.
export function scaleFor(colour, peak, title) {
  if (colour === "sqrt") {
    return { map: Math.sqrt, zmax: 1, colorbar: { title: { text: title }, tickvals: [0, 0.1, 0.3, 0.5, 0.7, 1].map(Math.sqrt), ticktext: ["0", "0.1", "0.3", "0.5", "0.7", "1"], thickness: 12 } };
  }
  const top = colour === "view" && peak > 0 ? peak : 1;
  return { map: (v) => v, zmax: top, colorbar: { title: { text: title }, thickness: 12 } };
}

// Below this largest weight, the linear scale draws a view almost white: the page says so.
export const FAINT = 0.1;
