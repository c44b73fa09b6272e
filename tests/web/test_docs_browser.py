"""/docs renders the app's OpenAPI 3.1 schema (Swagger UI 5 from the installed package)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.browser


def test_docs_lists_every_endpoint_and_links_back(page: object, base_url: str) -> None:
    schema = page.request.get(base_url + "/openapi.json").json()
    assert schema["openapi"].startswith("3.1")
    expected = {(method.upper(), path) for path, ops in schema["paths"].items() for method in ops}
    page.goto(base_url + "/docs")
    page.wait_for_selector(".opblock-summary", timeout=30_000)
    assert page.locator("text=Unable to render this definition").count() == 0
    shown = set()
    for block in page.locator(".opblock-summary").all():
        method = block.locator(".opblock-summary-method").text_content().strip()
        path = block.locator(".opblock-summary-path").get_attribute("data-path")
        shown.add((method, path))
    assert shown == expected
    back = page.get_by_test_id("back-to-app")
    assert back.get_attribute("href") in ("/", "/?lang=en")  # the nav carries the reader's language
    requests = []
    page.on("request", lambda r: requests.append(r.url))
    page.reload()
    page.wait_for_selector(".opblock-summary")
    assert all(u.startswith((base_url, "data:")) for u in requests), requests
