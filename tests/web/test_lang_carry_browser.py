"""The reader's language follows them from page to page: chosen on the explorer, it holds on
/learn (through the nav and when the address is typed plainly), on /docs' own header, and back;
choosing English again on any page carries English the same way."""

from __future__ import annotations

from urllib.parse import parse_qs, urlparse

import pytest

pytestmark = pytest.mark.browser
PAINTED = "(l) => document.documentElement.dataset.painted === l"


def page_lang(page: object) -> str:
    page.wait_for_function("() => !!document.documentElement.dataset.painted", timeout=60_000)
    return page.evaluate("() => document.documentElement.lang")


def nav_langs(page: object) -> set[str]:
    hrefs = page.locator("header.top nav a").evaluate_all("(as) => as.map((a) => a.getAttribute('href'))")
    return {parse_qs(urlparse(h).query).get("lang", [""])[0] for h in hrefs}


def test_the_language_carries_across_pages(page: object, base_url: str) -> None:
    page.add_init_script("navigator.__proto__.__defineGetter__('languages', () => ['en-US'])")
    page.goto(f"{base_url}/")
    assert page_lang(page) == "en"
    page.get_by_test_id("lang-switch").click()
    page.wait_for_function(PAINTED, arg="zh")
    assert nav_langs(page) == {"zh"}  # the nav links now carry the choice
    page.locator("header.top nav a", has_text="学习").click()
    page.wait_for_url("**/learn**")
    assert page_lang(page) == "zh-CN"
    assert page.locator("header.top nav a").first.text_content() == "探索器"
    # typed plainly, without ?lang=: the stored choice holds
    for path in ("/learn", "/", "/docs"):
        page.goto(f"{base_url}{path}")
        assert page_lang(page) == "zh-CN", path
    # /docs is ours: its nav and intro follow (Swagger UI's own words stay English)
    assert page.locator("header.top nav a").all_text_contents() == ["探索器", "学习", "接口文档"]
    assert "接口" in page.get_by_test_id("docs-intro").text_content()
    assert page.title() == "attnscope 接口文档"
    # English chosen on /docs carries back to the explorer
    page.get_by_test_id("lang-switch").click()
    page.wait_for_function(PAINTED, arg="en")
    page.get_by_test_id("back-to-app").click()
    page.wait_for_url(lambda u: urlparse(u).path == "/")
    assert page_lang(page) == "en"
    page.goto(f"{base_url}/learn")
    assert page_lang(page) == "en"
    # an explicit ?lang= still wins over the stored choice
    page.goto(f"{base_url}/learn?lang=zh")
    assert page_lang(page) == "zh-CN"
