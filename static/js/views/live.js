// The heatmap while a generation streams in: one canvas pixel per cell. The canvas is sized
// once for the whole generation (the prompt plus the tokens asked for) and each row is painted
// once, when it arrives, so a redraw costs the new rows only — not the whole square again —
// and the page keeps up with the stream. Rows not computed yet show as the masked grey
// (app.css's --masked); once complete the recorded run is drawn as the full plotly heatmap.
import { hexRGB, maskColours, rgb } from "./colour.js";

export class LiveHeatmap {
  constructor(canvas, size, colour = "linear") {
    this.canvas = canvas;
    this.colour = colour;
    this.painted = 0; // rows painted so far
    this.mask = hexRGB(maskColours().fill);
    canvas.width = size;
    canvas.height = size;
    this.ctx = canvas.getContext("2d");
    this.ctx.fillStyle = maskColours().fill;
    this.ctx.fillRect(0, 0, size, size);
  }

  get size() {
    return this.canvas.width;
  }

  // Paint rows[painted ..] (row r holds the weights of the keys query r can see); returns how
  // many rows were new.
  draw(rows) {
    const from = this.painted;
    const to = Math.min(rows.length, this.size);
    if (to <= from) return 0;
    let width = 1;
    for (let r = from; r < to; r++) width = Math.max(width, Math.min(this.size, rows[r].length));
    const img = this.ctx.createImageData(width, to - from);
    const [mr, mg, mb] = this.mask;
    const sqrt = this.colour === "sqrt";
    for (let r = from; r < to; r++) {
      const row = rows[r];
      let p = (r - from) * width * 4;
      for (let c = 0; c < width; c++, p += 4) {
        if (c < row.length) {
          const [R, G, B] = rgb(sqrt ? Math.sqrt(row[c]) : row[c]);
          img.data[p] = R; img.data[p + 1] = G; img.data[p + 2] = B;
        } else {
          img.data[p] = mr; img.data[p + 1] = mg; img.data[p + 2] = mb;
        }
        img.data[p + 3] = 255;
      }
    }
    this.ctx.putImageData(img, 0, from);
    this.painted = to;
    return to - from;
  }
}
