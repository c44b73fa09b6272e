"""The causal tools in headless Chromium on the bundled model: each view opens from the URL."""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urlencode, urlparse

import pytest

from tests.support.browser import shot

pytestmark = pytest.mark.browser
PROMPT = "The cat sat on the mat. The cat sat on the mat."


def open_view(page: object, base_url: str, view: str, **extra: str) -> None:
    query = urlencode({"text": PROMPT, "model": "attnscope-tiny", "pos": "9", "view": view, **extra})
    page.goto(f"{base_url}/?{query}")
    page.wait_for_selector(f"[data-testid=tool-view-{view}]")


def shape(page: object) -> tuple[int, int]:
    """(layers, heads) of the bundled model, as the page's run reports them."""
    page.wait_for_function("() => document.querySelectorAll('[data-testid=head-cell]').length > 0")
    layers = page.evaluate("() => new Set([...document.querySelectorAll('[data-testid=head-cell]')].map(c => c.dataset.layer)).size")
    heads = page.get_by_test_id("head-cell").count() // layers
    return layers, heads


def chart(page: object, testid: str) -> dict:
    """The first trace of a plotly chart, once drawn."""
    page.wait_for_function(f"() => {{ const d = document.querySelector('[data-testid={testid}]'); return d && d.data; }}")
    return page.evaluate(f"""() => {{
        const d = document.querySelector('[data-testid={testid}]');
        const tr = d.data.find((x) => x.type === 'heatmap') || d.data[0];  // a hatched mask trace may lie under it
        return {{z: tr.z, x: tr.x, y: tr.y, zmin: tr.zmin, zmax: tr.zmax, types: d.data.map((x) => x.type),
                 fillpattern: d.data[0].fillpattern || null, layout: d.layout, data: {{...d.dataset}}}};
    }}""")


def test_attribution_view_from_the_url_sums_and_selects_a_head(page: object, base_url: str) -> None:
    open_view(page, base_url, "attribution")
    layers, heads = shape(page)
    heat = chart(page, "attribution-heatmap")
    # layers x (heads, FFN): a Llama has no attention biases, so no empty column for them
    assert len(heat["z"]) == layers and len(heat["z"][0]) == heads + 1 and heat["x"][-1] == "FFN"
    data = heat["data"]
    assert abs(float(data["sum"]) + float(data["error"]) - float(data["logit"])) < 1e-6
    summary = page.get_by_test_id("attribution-summary").text_content()
    assert "float residue" in summary and "no biases" in summary
    # the summary's parts, each a number, add up to the logit
    parts = re.search(r"= (-?[\d.]+) = embeddings (-?[\d.]+) \+ heads (-?[\d.]+) \+ FFNs (-?[\d.]+) \+ final norm shift (-?[\d.]+)",
                      summary.replace("−", "-"))
    assert parts, summary
    logit, *terms = (float(v) for v in parts.groups())
    assert abs(sum(terms) - logit) < 0.01
    # a difference of two logits
    options = page.locator("[data-testid=attribution-token-b] option")
    page.get_by_test_id("attribution-token-b").select_option(options.nth(2).get_attribute("value"))
    page.wait_for_function("() => document.querySelector('[data-testid=attribution-summary]').textContent.includes('−')")
    # clicking a head cell selects that head in the explorer
    page.evaluate("""() => {
        const d = document.querySelector('[data-testid=attribution-heatmap]');
        d.emit('plotly_click', {points: [{pointIndex: [1, 2]}]});
    }""")
    page.wait_for_function("() => document.querySelector('[data-testid=heatmap]').dataset.layer === '1'")
    assert page.evaluate("() => document.querySelector('[data-testid=heatmap]').dataset.head") == "2"
    assert parse_qs(urlparse(page.url).query)["view"] == ["attribution"]
    shot(page, "tools-attribution")


def test_ablation_panel_toggles_heads_and_scans(page: object, base_url: str) -> None:
    open_view(page, base_url, "ablate")
    layers, heads = shape(page)
    page.wait_for_selector("[data-testid=ablation-panel][data-heads='0']")
    kl = chart(page, "ablation-kl")
    assert kl["data"]["max"] == "0"  # nothing ablated: the model's own distribution
    # KL >= 0 on a 0-based sequential scale: KL = 0 is the scale's white end, not mid-scale
    assert kl["zmin"] == 0 and kl["zmax"] > 0
    page.get_by_test_id("ablate-1-1").click()
    page.wait_for_selector("[data-testid=ablation-panel][data-heads='1']")
    page.wait_for_function("() => Number(document.querySelector('[data-testid=ablation-kl]').dataset.max) > 0")
    kl = chart(page, "ablation-kl")
    assert kl["zmin"] == 0 and abs(kl["zmax"] - float(kl["data"]["max"])) < 1e-9
    assert page.get_by_test_id("ablate-1-1").get_attribute("aria-pressed") == "true"
    assert "1 head ablated (zero)" in page.get_by_test_id("ablation-note").text_content()  # singular
    assert parse_qs(urlparse(page.url).query)["ablate"] == ["1.1"]
    page.get_by_test_id("ablation-mode").select_option("mean")
    page.wait_for_function("() => document.querySelector('[data-testid=ablation-note]').textContent.includes('(mean)')")
    page.get_by_test_id("ablation-scan-button").click()
    scan = chart(page, "ablation-scan")
    assert scan["data"]["cells"] == str(layers * (heads + 1))
    assert any(abs(v) > 0 for row in scan["z"] for v in row)
    shot(page, "tools-ablation")


def test_patch_view_from_the_url(page: object, base_url: str) -> None:
    # a pair the bundled model separates (clean +0.43, corrupted -0.25): a gap under 0.5 is warned about and
    # not normalised (the IOI pair gives it -0.06 against +0.25)
    open_view(page, base_url, "patch", clean="My friend John lives in the city. My friend John lives in the",
              corrupted="My friend John lives in the country. My friend John lives in the", answer=" city", wrong=" country")
    layers, heads = shape(page)
    page.wait_for_selector(f"[data-testid=patch-heatmap][data-stages='{layers + 1}']")
    resid = chart(page, "patch-resid")
    n = int(page.get_by_test_id("patch-heatmap").get_attribute("data-positions"))
    assert len(resid["z"]) == layers + 1 and len(resid["z"][0]) == n
    assert abs(resid["z"][layers][n - 1] - 1) < 1e-3  # the final residual at the answer position restores it all
    grid = chart(page, "patch-heads")
    assert len(grid["z"]) == layers and len(grid["z"][0]) == heads
    assert "first differ" in page.get_by_test_id("patch-summary").text_content()
    # a bad pair: the message names the token counts
    page.get_by_test_id("patch-corrupted").fill("My friend John lives in the country. My friend John lives in the old")
    page.get_by_test_id("patch-run").click()
    # shown in the tool's own panel by its button (not the page's banner far above), and the earlier
    # result marked as belonging to the earlier inputs
    page.wait_for_function("() => document.querySelector('[data-testid=tool-error]').textContent.includes('tokens and the corrupted one')")
    alert = page.get_by_test_id("tool-error")
    assert alert.is_visible() and alert.get_attribute("role") == "alert"
    assert "earlier inputs" in alert.text_content()
    assert page.get_by_test_id("tool-view-patch").get_attribute("data-stale") == "1"
    assert page.evaluate("() => getComputedStyle(document.querySelector('[data-testid=patch-summary]')).opacity") == "0.4"
    assert page.get_by_test_id("error-message").is_hidden()
    # the alert sits right under the form with the Patch button
    gap = page.evaluate("""() => document.querySelector('[data-testid=tool-error]').getBoundingClientRect().top
        - document.querySelector('[data-testid=patch-run]').getBoundingClientRect().bottom""")
    assert 0 <= gap < 80
    shot(page, "tools-patch-refused")
    # an answer of two tokens is refused the same way
    page.get_by_test_id("patch-corrupted").fill("When Peter and John went to the store, Peter gave a drink to")
    page.get_by_test_id("patch-answer").fill(" Mary Ann")
    page.get_by_test_id("patch-run").click()
    page.wait_for_function("() => !document.querySelector('[data-testid=tool-error]').textContent.includes('tokens and the corrupted one')")
    page.wait_for_function("() => document.querySelector('[data-testid=tool-error]').textContent.includes('earlier inputs')")
    # a good pair again: the alert goes, the result is current
    page.get_by_test_id("patch-answer").fill(" Peter")
    page.get_by_test_id("patch-run").click()
    page.wait_for_selector("[data-testid=tool-view-patch][data-stale='0']")
    assert page.get_by_test_id("tool-error").is_hidden()
    page.console_watch.errors = [e for e in page.console_watch.errors if "422" not in e]  # the refusals, expected
    query = parse_qs(urlparse(page.url).query)
    assert query["view"] == ["patch"] and query["answer"] == [" Peter"]
    shot(page, "tools-patch")


def test_patch_refusals_read_in_chinese(page: object, base_url: str) -> None:
    """The Patch tool's refusals, on the Chinese page: translated, with the server's numbers."""
    open_view(page, base_url, "patch", lang="zh", clean="When Peter and John went to the store, John gave a drink to",
              corrupted="When Peter and John went to the store, Peter gave a drink to her", answer=" Peter", wrong=" John")
    alert = page.get_by_test_id("tool-error")
    page.wait_for_function("() => document.querySelector('[data-testid=tool-error]')?.textContent.includes('损坏提示词有')")
    said = alert.text_content()
    assert "token 数相同" in said and "corrupted" not in said
    clean, corrupted = (int(x) for x in re.findall(r"\d+", said)[:2])  # the server's counts: one token apart
    assert corrupted == clean + 1
    page.get_by_test_id("patch-corrupted").fill("When Peter and John went to the store, Peter gave a drink to")
    page.get_by_test_id("patch-answer").fill(" Mary Ann")
    page.get_by_test_id("patch-run").click()
    page.wait_for_function("() => document.querySelector('[data-testid=tool-error]').textContent.includes('恰好是一个 token')")
    assert "Mary Ann" in alert.text_content() and "must be" not in alert.text_content()
    page.get_by_test_id("patch-answer").fill(" Peter")
    page.get_by_test_id("patch-wrong").fill(" Peter")
    page.get_by_test_id("patch-run").click()
    page.wait_for_function("() => document.querySelector('[data-testid=tool-error]').textContent.includes('同一个 token')")
    assert "Peter" in alert.text_content() and "服务器返回" not in alert.text_content()
    page.console_watch.errors = [e for e in page.console_watch.errors if "422" not in e]  # the refusals, expected


def test_lens_and_residual_views(page: object, base_url: str) -> None:
    open_view(page, base_url, "lens")
    layers, _ = shape(page)
    lens = chart(page, "logit-lens")
    assert len(lens["z"]) == layers + 1  # embeddings + every block
    # the help says where the output is: plotly draws the first category (embeddings) at the bottom
    assert lens["y"][0] == "embed" and lens["layout"]["yaxis"].get("autorange") != "reversed"
    assert "the top row is the model’s output" in page.get_by_test_id("tool-view-lens").text_content()
    page.get_by_test_id("tool-tab-residual").click()
    res = chart(page, "residual-chart")
    assert res["x"] == ["embed"] + [f"block {i}" for i in range(layers)]
    assert page.get_by_test_id("residual-chart").get_attribute("data-pos") == "9"
    page.get_by_test_id("token").nth(4).click()
    page.wait_for_selector("[data-testid=residual-chart][data-pos='4']")
    assert parse_qs(urlparse(page.url).query)["view"] == ["residual"]


def test_compare_a_head_on_two_prompts(page: object, base_url: str) -> None:
    open_view(page, base_url, "compare", compare="The dog sat on the mat. The dog sat on the mat.")
    page.wait_for_selector("[data-testid=head-compare][data-n]")
    box = page.get_by_test_id("head-compare")
    assert box.get_attribute("data-n") == page.evaluate("() => String(document.querySelectorAll('[data-testid=token]').length)")
    assert float(box.get_attribute("data-max-diff")) > 0
    diff = chart(page, "compare-diff")
    assert diff["z"][0][1] is None  # the causal mask stays empty in the difference
    # ... and is hatched, as in the explorer's heatmap, in all three charts (never plain white)
    for testid in ("compare-a", "compare-b", "compare-diff"):
        drawn = chart(page, testid)
        assert drawn["types"] == ["scatter", "heatmap"] and drawn["fillpattern"]["shape"] == "/"
        assert drawn["data"]["masked"] == "1"
    assert "Both prompts have" in page.get_by_test_id("compare-note").text_content()
    shot(page, "tools-compare")
    # a refused prompt: the error by the Compare button, the earlier charts marked as the earlier inputs'
    page.get_by_test_id("compare-prompt").fill("")
    page.get_by_test_id("compare-run").click()
    page.wait_for_selector("[data-testid=tool-view-compare][data-stale='1']")
    alert = page.get_by_test_id("tool-error")
    assert alert.is_visible() and "earlier inputs" in alert.text_content()
    assert page.get_by_test_id("error-message").is_hidden()
    page.console_watch.errors = [e for e in page.console_watch.errors if "422" not in e]  # the refusal, expected


def test_compare_offers_the_same_tokens_reordered(page: object, base_url: str) -> None:
    """The default second prompt differs from the first in either language: two words swapped,
    or, in Chinese (no spaces), two characters."""
    query = urlencode({"text": "我爱人工智能", "model": "attnscope-tiny", "view": "compare"})
    page.goto(f"{base_url}/?{query}")
    page.wait_for_selector("[data-testid=head-compare][data-n]")
    assert page.get_by_test_id("compare-prompt").input_value() == "爱我人工智能"
    out = page.evaluate("""async () => { const { reordered } = await import('/static/js/tools/compare.js');
        return ['dog bites man', '我爱人工智能', '  好好学习', 'x', '😀🙂 ok'].map(reordered); }""")
    assert out == ["dog man bites", "爱我人工智能", "  好学好习", "x", "🙂😀 ok"]  # the 2nd and 3rd words: same tokens


def test_compare_long_prompts_as_tiles(page: object, base_url: str) -> None:
    """Above the tile size both heads are fetched as max-pooled tiles of their common positions (the
    same bins), never whole: the difference is bin by bin and the note says how it pools."""
    words = ["the", "river", "town", "grew", "into", "a", "city", "with", "bridges", "walls", "and", "a", "market", "by", "the", "hills"]
    long_a = " ".join(words[i % len(words)] for i in range(420))
    long_b = " ".join(words[(i * 3) % len(words)] for i in range(420))
    query = urlencode({"text": long_a, "model": "attnscope-tiny", "view": "compare", "compare": long_b})
    page.goto(f"{base_url}/?{query}")
    page.wait_for_selector("[data-testid=head-compare][data-n]", timeout=60_000)
    box = page.get_by_test_id("head-compare")
    n = int(box.get_attribute("data-n"))
    assert n > 256 and box.get_attribute("data-pooled") == "1" and float(box.get_attribute("data-max-diff")) > 0
    diff = chart(page, "compare-diff")
    assert len(diff["z"]) == 256 and len(diff["x"]) == 257 and diff["x"][-1] == n - 0.5
    assert diff["z"][0][-1] is None  # the causal future stays empty
    assert diff["types"] == ["scatter", "heatmap"] and diff["fillpattern"]["shape"] == "/"  # and hatched
    note = page.get_by_test_id("compare-note").text_content()
    assert "256 × 256 grid" in note and "Largest change" in note
    assert page.get_by_test_id("error-message").is_hidden()


def test_residual_cosine_axis_shows_a_negative_cosine(page: object, base_url: str) -> None:
    """A cosine below 0 stays on the plot: the axis reaches down past it (it is not fixed at [0, 1])."""

    def negative(route: object) -> None:
        response = route.fetch()
        body = response.json()
        for layer in body["layers"]:
            layer["cos_prev"] = [-0.63 for _ in layer["cos_prev"]]
        route.fulfill(response=response, json=body)

    page.route("**/api/runs/*/residual", negative)
    open_view(page, base_url, "residual")
    res = chart(page, "residual-chart")
    low, high = res["layout"]["yaxis2"]["range"]
    assert low < -0.63 and high >= 1
    cos = page.evaluate("() => document.querySelector('[data-testid=residual-chart]').data[1].y")
    assert all(low <= c <= high for c in cos)


def test_why_here_splits_the_selected_cells_logit(page: object, base_url: str) -> None:
    """On the bundled model's induction head (layer 4 head 0), a cell of the repeated sentence: "Why here?"
    opens the QK attribution of that query and key; its terms add up to the logit, and the key side is led
    by an earlier head (the previous-token head the induction story expects)."""
    page.goto(f"{base_url}/?{urlencode({'text': PROMPT, 'model': 'attnscope-tiny', 'layer': '4', 'head': '0'})}")
    page.wait_for_function("() => document.querySelector('[data-testid=heatmap]').dataset.n")
    button = page.get_by_test_id("why-here")
    assert button.is_visible()
    # query: the second " mat" (12); key: the token after the first " mat" (6), where an induction head looks
    page.evaluate("() => document.querySelector('[data-testid=heatmap]').emit('plotly_click', {points: [{y: 12, x: 6, data: {type: 'heatmap'}}]})")
    button.click()
    page.wait_for_selector("[data-testid=qk-matrix][data-sum]", state="attached", timeout=60_000)
    assert parse_qs(urlparse(page.url).query)["view"] == ["qk"]
    title = page.get_by_test_id("qk-title").text_content()
    assert "at 12" in title and "at 6" in title, title
    data = page.evaluate("() => ({...document.querySelector('[data-testid=qk-matrix]').dataset})")
    logit, total, error = float(data["logit"]), float(data["sum"]), float(data["error"])
    assert abs(total - logit) < 1e-4 * (1 + abs(logit)) and abs(error) < 1e-4 * (1 + abs(logit))
    top = __import__("json").loads(data["top"])
    assert top["key"]["kind"] == "head" and top["key"]["layer"] < 4, top
    heat = chart(page, "qk-matrix")
    assert heat["x"][-1] == "all others" and heat["y"][-1] == "all others"
    assert len(heat["z"]) == len(heat["y"]) and len(heat["z"][0]) == len(heat["x"])
    for testid in ("qk-query-bars", "qk-key-bars"):
        bars = chart(page, testid)
        assert bars["types"] == ["bar"]
    summary = page.get_by_test_id("qk-summary").text_content()
    assert "attention weight" in summary and "residue" in summary
    # another cell of the same row redraws the view for that key
    page.evaluate("() => document.querySelector('[data-testid=heatmap]').emit('plotly_click', {points: [{y: 12, x: 5, data: {type: 'heatmap'}}]})")
    page.wait_for_function("() => document.querySelector('[data-testid=qk-title]').textContent.includes('at 5')")
    page.wait_for_selector("[data-testid=qk-matrix][data-sum]", state="attached", timeout=60_000)
    shot(page, "tools-why-here")
