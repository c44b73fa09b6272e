// The heatmap while a generation streams in: one canvas pixel per cell, redrawn at most once an
// animation frame (a few milliseconds even at 600 rows), so that the page keeps up with the
// stream; the recorded run is drawn as the full plotly heatmap once it is complete.
import { hexRGB, maskColours, rgb } from "./colour.js";

export function drawLive(canvas, rows, colour = "linear") {
  const n = rows.length;
  if (canvas.width !== n) { canvas.width = n; canvas.height = n; }
  const ctx = canvas.getContext("2d");
  const img = ctx.createImageData(n, n);
  const masked = hexRGB(maskColours().fill); // app.css's --masked
  for (let r = 0; r < n; r++) {
    const row = rows[r];
    for (let c = 0; c < n; c++) {
      const p = (r * n + c) * 4;
      const v = c < row.length ? row[c] : null;
      const [R, G, B] = v === null ? masked : rgb(colour === "sqrt" ? Math.sqrt(v) : v);
      img.data[p] = R; img.data[p + 1] = G; img.data[p + 2] = B; img.data[p + 3] = 255;
    }
  }
  ctx.putImageData(img, 0, 0);
}
