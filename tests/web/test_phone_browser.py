"""Phone width (390 px) in Chromium, measured by bounding boxes (issue 27): plotly's mode bar
covers no title, axis title or plot; the logit lens's cell text stays inside its cells; Lesson 3's
x labels do not collide; Lesson 2's table wraps between tokens, never inside one."""

from __future__ import annotations

from urllib.parse import quote, urlencode

import pytest

pytestmark = pytest.mark.browser
PROMPT = "The cat sat on the mat. The cat sat on the mat."
PHONE = {"viewport": {"width": 390, "height": 844}, "device_scale_factor": 2, "is_mobile": True, "has_touch": True}
READY = "() => document.querySelector('[data-testid=heatmap]').dataset.n && !document.body.dataset.busy"

# What a chart's mode bar lies over: titles, axis titles, tick labels, legend, colour bar, the plot.
COVERED = """() => {
  const out = [];
  for (const gd of document.querySelectorAll('.js-plotly-plot')) {
    if (!gd.offsetParent) continue;
    const bar = gd.querySelector('.modebar');
    if (!bar) continue;
    const m = bar.getBoundingClientRect();
    if (!m.width || !m.height) continue;  // not shown
    for (const t of gd.querySelectorAll('.gtitle, .g-xtitle text, .g-ytitle text, .xtick text, .ytick text, .legend .bg, .cbtitle text, .draglayer .nsewdrag')) {
      const r = t.getBoundingClientRect();
      if (!r.width) continue;
      if (Math.min(m.bottom, r.bottom) - Math.max(m.top, r.top) > 1 && Math.min(m.right, r.right) - Math.max(m.left, r.left) > 1)
        out.push(`${gd.dataset.testid || gd.id}: mode bar over ${t.getAttribute('class') || t.tagName} "${t.textContent.slice(0, 30)}"`);
    }
  }
  return out;
}"""

# Pairs of boxes (the selector's elements inside the chart) that overlap by more than a pixel.
OVERLAPS = """([chart, selector]) => {
  const boxes = [...document.querySelector(`[data-testid=${chart}]`).querySelectorAll(selector)]
    .filter((t) => t.textContent).map((t) => [t.textContent, t.getBoundingClientRect()]);
  const out = [];
  for (const [i, [a, ra]] of boxes.entries())
    for (const [b, rb] of boxes.slice(i + 1))
      if (Math.min(ra.right, rb.right) - Math.max(ra.left, rb.left) > 1 && Math.min(ra.bottom, rb.bottom) - Math.max(ra.top, rb.top) > 1)
        out.push(`"${a}" overlaps "${b}"`);
  return {count: boxes.length, out};
}"""


@pytest.fixture
def phone(browser: object) -> object:
    context = browser.new_context(**PHONE)
    page = context.new_page()
    yield page
    context.close()


@pytest.mark.parametrize("view", ["compare", "ablate"])
def test_mode_bar_covers_nothing_at_phone_width(phone: object, base_url: str, view: str) -> None:
    phone.goto(f"{base_url}/?{urlencode({'text': PROMPT, 'model': 'attnscope-tiny', 'pos': '9', 'view': view})}")
    phone.wait_for_function(READY, timeout=120_000)
    chart = "compare-diff" if view == "compare" else "ablation-kl"
    phone.wait_for_function(f"() => document.querySelector('[data-testid={chart}]') && document.querySelector('[data-testid={chart}]')._fullLayout",
                            timeout=120_000)
    phone.wait_for_timeout(300)
    assert phone.evaluate("() => document.querySelectorAll('.js-plotly-plot .modebar').length") >= 4  # plotly drew them
    assert (covered := phone.evaluate(COVERED)) == [], "\n".join(covered)


def test_logit_lens_cell_text_stays_in_its_cells(phone: object, base_url: str) -> None:
    phone.goto(f"{base_url}/?{urlencode({'text': PROMPT, 'model': 'attnscope-tiny', 'pos': '9', 'view': 'lens'})}")
    phone.wait_for_function("() => document.querySelector('[data-testid=logit-lens]') && document.querySelector('[data-testid=logit-lens]')._fullLayout",
                            timeout=120_000)
    got = phone.evaluate(OVERLAPS, ["logit-lens", ".heatmap-label"])
    assert got["out"] == [], "\n".join(got["out"])
    cell = phone.evaluate("() => { const gd = document.querySelector('[data-testid=logit-lens]'); return gd._fullLayout.xaxis._length / Number(gd.dataset.positions); }")
    widths = phone.evaluate("() => [...document.querySelectorAll('[data-testid=logit-lens] .heatmap-label')].filter(t => t.textContent).map(t => t.getBoundingClientRect().width)")
    assert widths and max(widths) <= cell, (max(widths), cell)
    # the hover still names the whole token
    full = phone.evaluate("() => document.querySelector('[data-testid=logit-lens]').data[0].customdata.flat()")
    shown = phone.evaluate("() => document.querySelector('[data-testid=logit-lens]').data[0].text.flat()")
    assert len(full) == len(shown) and any(s == "" and f for s, f in zip(shown, full, strict=True))


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_learn_at_phone_width(phone: object, base_url: str, lang: str) -> None:
    phone.goto(f"{base_url}/learn?text={quote(PROMPT)}&lang={lang}")
    phone.wait_for_function("() => document.querySelectorAll('.lesson-body[data-ready]').length === 9", timeout=600_000)
    phone.wait_for_timeout(300)
    assert (covered := phone.evaluate(COVERED)) == [], "\n".join(covered)
    # Lesson 3: eleven bars' labels ("8505 ␣worthy") side by side, none over another
    got = phone.evaluate(OVERLAPS, ["ids-chart", ".xtick text"])
    assert got["count"] >= 10 and got["out"] == [], "\n".join(got["out"])
    # Lesson 2: every token of the table on one line (a row breaks between tokens only)
    spans = phone.evaluate("""() => [...document.querySelectorAll('[data-testid=parallel-table] .tok')]
        .map((s) => [s.textContent, s.getClientRects().length])""")
    n = phone.evaluate("() => document.querySelectorAll('[data-testid=parallel-table] tbody tr').length")
    assert len(spans) >= 2 * n  # the prefix's tokens, the predicted and the true next token
    assert [s for s in spans if s[1] != 1] == []
    # and the table still fits the phone: the page does not scroll sideways
    assert phone.evaluate("() => document.documentElement.scrollWidth <= document.documentElement.clientWidth")
    # the generation steps' chart: its long x title wraps inside the chart (plotly cut it at the edge)
    phone.get_by_test_id("parallel-generate").click()
    phone.wait_for_function("() => document.querySelector('[data-testid=parallel-stream]').dataset.done", timeout=120_000)
    box = phone.evaluate("""() => { const gd = document.querySelector('[data-testid=parallel-steps]'), b = gd.getBoundingClientRect(),
        r = gd.querySelector('.g-xtitle text').getBoundingClientRect(); return [b.left, b.right, r.left, r.right]; }""")
    assert box[0] - 1 <= box[2] and box[3] <= box[1] + 1, box
