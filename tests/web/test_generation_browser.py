"""Generation in the browser keeps the page answering (issue 12), asserted by structure, never
by timing: while tokens stream, every row of the live view is painted once (a redraw costs the
new rows only) and redraws never outnumber animation frames; when the stream ends, the
recorded run is drawn in pieces, and the page's event loop runs between every two of them (a
task queued when a piece starts runs before the next piece starts)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.browser
READY = "() => document.querySelector('[data-testid=heatmap]').dataset.n && !document.body.dataset.busy"
FINAL_PIECES = ["attnscope:heatmap", "attnscope:focus", "attnscope:grid", "attnscope:next"]

# Every "attnscope:*" mark queues a task; the task records the newest mark when it runs.
PROBE = """() => {
  window.__probes = []; window.__marks = []; window.__frames = 0; window.__stopFrames = false;
  const mark = performance.mark.bind(performance);
  performance.mark = (name, ...rest) => {
    if (name.startsWith('attnscope:')) {
      window.__marks.push(name);
      const at = window.__marks.length - 1;
      setTimeout(() => window.__probes.push([at, window.__marks.length - 1]), 0);
    }
    return mark(name, ...rest);
  };
  const tick = () => { window.__frames++; if (!window.__stopFrames) requestAnimationFrame(tick); };
  requestAnimationFrame(tick);
}"""


def generate(page: object, count: int) -> dict:
    page.get_by_test_id("generate-count").fill(str(count))
    page.get_by_test_id("generate-temperature").fill("1")
    page.evaluate(PROBE)
    page.get_by_test_id("generate-button").click()
    page.wait_for_function("() => !document.querySelector('#timeline-box').hidden", timeout=120_000)
    page.wait_for_function(READY, timeout=60_000)
    return page.evaluate("""() => { window.__stopFrames = true; const d = document.querySelector('[data-testid=heatmap]').dataset;
        return { marks: window.__marks, probes: window.__probes, frames: window.__frames, draws: Number(d.liveDraws),
                 rows: Number(d.liveRows), painted: Number(d.livePainted), tokens: Number(d.liveTokens), n: Number(d.n) }; }""")


def test_live_view_paints_each_row_once_and_the_final_redraw_yields_between_pieces(page: object, base_url: str) -> None:
    page.goto(f"{base_url}/?text=The%20history%20of%20the%20city%20begins")
    page.wait_for_function(READY, timeout=60_000)
    got = generate(page, 24)
    assert got["tokens"] >= 1
    # the live view: every streamed row painted exactly once over all redraws, at most one a frame
    assert got["painted"] == got["rows"] == got["n"] - 1 or got["painted"] == got["rows"] == got["n"]
    assert 1 <= got["draws"] <= got["frames"]
    # the recorded run, drawn in pieces: heatmap, focus, grid, the rest — in this order
    marks = got["marks"]
    assert all(name in marks for name in FINAL_PIECES), marks
    last = [len(marks) - 1 - marks[::-1].index(name) for name in FINAL_PIECES]
    assert last == sorted(last), marks
    # between every two pieces the page ran other tasks: each probe ran before the next mark
    ran = dict(got["probes"])
    assert len(ran) == len(marks), got["probes"]
    assert all(ran[i] == i for i in range(len(marks))), (marks, got["probes"])


def test_a_finished_generation_logs_no_failed_request(page: object, base_url: str) -> None:
    """Every finished generation logged a failed /api/generate (net::ERR_ABORTED): Chromium cancels a
    "Cache-Control: no-store" response read through a stream reader even after its last byte. The
    stream is sent "no-cache"; several generations (the page's own and the page's readSSE over the
    same request) finish as finished requests, with no console error."""
    failed: list[str] = []
    page.on("requestfailed", lambda r: failed.append(f"{r.url} {r.failure}"))
    page.goto(f"{base_url}/?text=The%20cat%20sat%20on%20the%20mat.")
    page.wait_for_function(READY, timeout=60_000)
    for _ in range(2):
        with page.expect_response("**/api/generate") as answered:
            page.get_by_test_id("generate-count").fill("2")
            page.get_by_test_id("generate-button").click()
        assert answered.value.headers["cache-control"] == "no-cache"
        page.wait_for_function("() => !document.querySelector('#timeline-box').hidden", timeout=120_000)
        page.wait_for_function(READY, timeout=60_000)
    events = page.evaluate("""async () => {
        const { postStream, readSSE } = await import('/static/js/api.js');
        const seen = [];
        for (let i = 0; i < 6; i++) {
          const r = await postStream('/api/generate', { text: 'The cat sat', max_new_tokens: 2, record: true, watch_layer: 0, watch_head: 0 });
          for await (const ev of readSSE(r)) seen.push(ev.event);
        }
        return seen;
    }""")
    assert events.count("done") == 6
    page.wait_for_timeout(300)  # a cancelled request is reported just after its last byte
    assert failed == []


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_count_of_zero_minus_three_or_nothing_is_refused_at_the_box(page: object, base_url: str, lang: str) -> None:
    """Generate with 0, -3 or an empty count generated 1 token without a word: now a note right under
    the count box says what is wrong, in the page's language, and no generation starts."""
    page.goto(f"{base_url}/?text=The%20cat%20sat%20on%20the%20mat.&lang={lang}")
    page.wait_for_function(READY, timeout=60_000)
    asked: list[str] = []
    page.on("request", lambda r: "/api/generate" in r.url and asked.append(r.url))
    count = page.get_by_test_id("generate-count")
    note = page.get_by_test_id("generate-count-error")
    for value in ["0", "-3", ""]:
        count.fill(value)
        page.get_by_test_id("generate-button").click()
        note.wait_for()
        said = note.text_content()
        assert ("1 to 512" if lang == "en" else "1 到 512") in said, said
        assert value in said
        if lang == "zh":
            assert "要生成多少" in said or "不是可以生成的" in said, said
        assert count.get_attribute("aria-invalid") == "true"
        box, at = count.bounding_box(), note.bounding_box()
        assert 0 <= at["y"] - (box["y"] + box["height"]) < 40 and at["x"] <= box["x"], (box, at)  # under the box
    page.wait_for_timeout(300)
    assert asked == []
    assert page.get_by_test_id("generate-status").is_hidden()
    assert page.evaluate("() => document.body.dataset.busy") == ""
    if lang == "en":  # the note follows a language switch
        page.get_by_test_id("lang-switch").click()
        page.wait_for_function("() => document.querySelector('[data-testid=generate-count-error]').textContent.includes('1 到 512')")
    count.fill("2")  # a usable count clears it
    assert note.is_hidden()
    assert count.get_attribute("aria-invalid") == "false"


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_failure_after_the_stream_started_is_said_at_the_generate_control(
        page: object, base_url: str, bundled_engine: object, monkeypatch: pytest.MonkeyPatch, lang: str) -> None:
    """A failure after the stream has started ends it with an "error" event (the recorded run would not
    fit the run store, here): the page stops reading, says the server's message in its language next
    to Generate, and asks for no run that does not exist."""
    from attnscope.model.errors import TooLarge

    def too_large(*_args: object, **_kwargs: object) -> object:
        raise TooLarge("this prompt's run would keep 9 MiB (30 tokens; its forward peaks near 12 MiB); "
                       "the run store holds at most 1 MiB (ATTNSCOPE_RUN_STORE_BYTES)", code="run_too_big",
                       params={"keep": "9 MiB", "tokens": 30, "peak": "12 MiB", "cap": "1 MiB"})  # as budget.admit

    monkeypatch.setattr(bundled_engine.analyser, "store_generation", too_large)
    asked: list[str] = []
    page.on("request", lambda r: "/api/runs/" in r.url and asked.append(r.url))
    page.goto(f"{base_url}/?text=The%20cat%20sat%20on%20the%20mat.&lang={lang}")
    page.wait_for_function(READY, timeout=60_000)
    asked.clear()
    page.get_by_test_id("generate-count").fill("3")
    page.get_by_test_id("generate-button").click()
    status = page.get_by_test_id("generate-status")
    status.wait_for(state="visible", timeout=60_000)
    page.wait_for_function(READY, timeout=60_000)
    text = status.inner_text()
    assert ("would keep 9 MiB" if lang == "en" else "9 MiB") in text, text
    if lang == "zh":
        assert "Generation failed" not in text and "would keep" not in text, text  # translated, not English
    assert not [u for u in asked if "undefined" in u or "null" in u], asked


def test_a_refused_count_hides_the_last_generations_status(page: object, base_url: str) -> None:
    """After a generation, a count the box refuses must not leave "Generated 2 tokens…" beside the
    refusal, where it read as this request's answer."""
    page.goto(f"{base_url}/?text=The%20cat%20sat%20on%20the%20mat.")
    page.wait_for_function(READY, timeout=60_000)
    page.get_by_test_id("generate-count").fill("2")
    page.get_by_test_id("generate-button").click()
    page.get_by_test_id("generate-status").wait_for(state="visible", timeout=120_000)
    page.wait_for_function(READY, timeout=60_000)
    page.get_by_test_id("generate-count").fill("0")
    page.get_by_test_id("generate-button").click()
    assert page.get_by_test_id("generate-count-error").is_visible()
    assert page.get_by_test_id("generate-status").is_hidden()
