"""Accessibility: axe-core's WCAG 2.1 A and AA rules in headless Chromium, shown here to find the
faults it must on a page made to have them. The book's pages are checked in tests/test_book.py, on the
load that checks how each renders (a load typesets every equation: about 3 CPU-seconds a page); a
feedback page and the class report in tests/test_term.py, where a term made them."""

from __future__ import annotations

import pytest

from tests.browser import axe_violations, chromium

pytestmark = [pytest.mark.slow, pytest.mark.browser]


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    d = chromium(tmp_path_factory.mktemp("profile"))
    yield d
    d.quit()


def test_axe_finds_an_image_without_alt_text_low_contrast_and_an_unlabelled_field(driver, tmp_path):
    page = tmp_path / "bad.html"
    page.write_text(
        "<!doctype html><html lang='en'><head><title>Bad</title></head><body><main>"
        "<h1>A page</h1><img src='data:image/gif;base64,R0lGODlhAQABAAAAACw='>"
        "<p style='color:#bbb;background:#fff'>Pale grey text on white.</p>"
        "<input type='text'></main></body></html>"
    )
    driver.get(page.as_uri())
    found = {v.split(" ")[0] for v in axe_violations(driver)}
    assert {"image-alt", "color-contrast", "label"} <= found, found
    page.write_text(
        "<!doctype html><html lang='en'><head><title>Good</title></head><body><main>"
        "<h1>A page</h1><img alt='A one-pixel test image' src='data:image/gif;base64,R0lGODlhAQABAAAAACw='>"
        "<p>Black text on white.</p><label>Name <input type='text'></label></main></body></html>"
    )
    driver.get(page.as_uri())
    assert axe_violations(driver) == []
