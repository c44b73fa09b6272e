"""Render one head's attention from an exported run as a standalone SVG (for papers).

Cells use the app's white-to-blue scale; the causal mask is hatched, as in the browser.
Token text is escaped: it is untrusted and must never become markup.
"""

from __future__ import annotations

from itertools import pairwise
from xml.sax.saxutils import escape

# the masked (causal future) cell as the browser draws it: static/css/app.css's --masked and
# --mask-hatch (tests/test_cli.py checks they agree)
MASKED = "#e4e6ea"
MASK_HATCH = "#aab1ba"
SCALE = [(0.0, (255, 255, 255)), (0.1, (227, 238, 249)), (0.25, (183, 212, 234)), (0.45, (107, 174, 214)),
         (0.7, (33, 113, 181)), (1.0, (8, 48, 107))]


def colour(v: float) -> str:
    v = min(1.0, max(0.0, v))
    for (t0, c0), (t1, c1) in pairwise(SCALE):
        if v <= t1:
            f = (v - t0) / (t1 - t0)
            r, g, b = (round(a + f * (b_ - a)) for a, b_ in zip(c0, c1, strict=True))
            return f"#{r:02x}{g:02x}{b:02x}"
    return "#08306b"


def shown(text: str) -> str:
    return text.replace(" ", "\u2423").replace("\n", "\u23ce") or "\u2205"


def heatmap_svg(rows: list[list[float]], tokens: list[str], causal: bool, title: str, cell: int = 14) -> str:
    n = len(rows)
    margin = 12 + 7 * max((len(shown(t)) for t in tokens), default=1)
    size = margin + n * cell + 10
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{size}" height="{size + 24}" '
           'font-family="DejaVu Sans Mono, monospace" font-size="10">',
           '<defs><pattern id="mask" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">'
           f'<rect width="6" height="6" fill="{MASKED}"/>'
           f'<line x1="0" y1="0" x2="0" y2="6" stroke="{MASK_HATCH}" stroke-width="2"/></pattern></defs>',
           f'<text x="{margin}" y="14" font-size="12">{escape(title)}</text>']
    top = 24 + margin
    for i, row in enumerate(rows):
        y = top + i * cell
        out.append(f'<text x="{margin - 4}" y="{y + cell - 3}" text-anchor="end">{escape(shown(tokens[i]))}</text>')
        for j in range(n):
            x = margin + j * cell
            fill = colour(row[j]) if j < len(row) else "url(#mask)"
            out.append(f'<rect x="{x}" y="{y}" width="{cell}" height="{cell}" fill="{fill}"><title>{i}\u2192{j}: '
                       f'{row[j]:.4f}</title></rect>' if j < len(row) else
                       f'<rect x="{x}" y="{y}" width="{cell}" height="{cell}" fill="{fill}"/>')
    for j, tok in enumerate(tokens):
        x = margin + j * cell + cell - 3
        out.append(f'<text transform="translate({x},{top - 4}) rotate(-90)">{escape(shown(tok))}</text>')
    legend = "hatched = causal mask (future, not visible)" if causal else "encoder: every token sees every token"
    out.append(f'<text x="{margin}" y="{top + n * cell + 16}">{escape(legend)}</text></svg>')
    return "".join(out)
