"""The HTML report: self-contained (no script, nothing fetched), one plot per output and per GELU
site, readable without JavaScript; rendered in headless Chromium (Debian's package, which
.ci/run installs) with no console error, every plot drawn."""

import re
import shutil
from html.parser import HTMLParser

import pytest

from exporter import api
from fixtures.make_broken_onnx import build_fixture
from fixtures.models.hf_models import __file__ as HF_MODELS
from tests.conftest import tool_missing

# A Chromium or Chrome on PATH, by the names Debian, Ubuntu and Google's packages install it under.
CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome", "chrome"))), None)


class Elements(HTMLParser):
    """Tags with their attributes, and every id, of a page."""

    def __init__(self, text: str):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def count(self, tag: str) -> int:
        return sum(t == tag for t, _ in self.tags)

    def ids(self) -> list[str]:
        return [attrs["id"] for _, attrs in self.tags if "id" in attrs]


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    """A faithful transformers BERT export and a verify that catches a changed GELU, as HTML."""
    folder = tmp_path_factory.mktemp("html")
    faithful = api.export(f"{HF_MODELS}:bert", to="onnx", opset=17, out=folder / "bert.onnx",
                          reports={"html": folder / "bert.html"})
    assert faithful.exit_code == 0, faithful.summary_lines()
    fixture = build_fixture("exact_to_tanh", folder)
    broken = api.verify(fixture.path, source=fixture.source, reports={"html": folder / "broken.html"})
    assert broken.exit_code == 3
    return {"faithful": (folder / "bert.html", faithful), "broken": (folder / "broken.html", broken)}


@pytest.mark.parametrize("name", ["faithful", "broken"])
def test_the_page_is_self_contained_with_a_plot_per_output_and_gelu_site(pages, name):
    path, report = pages[name]
    text = path.read_text()
    page = Elements(text)
    assert page.count("script") == 0 and "<link" not in text
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", text)  # nothing fetched
    plotted_sites = [g for g in report.gelu if g.get("probes")]
    assert plotted_sites and page.count("svg") == len(report.outputs) + len(plotted_sites)
    ids = page.ids()
    assert len(ids) == len(set(ids))  # the inline SVGs' clip paths and glyphs do not collide
    assert f">{report.verdict.upper()}<" in text and report.artifact.sha256 in text


def test_a_changed_gelu_is_named_and_plotted_against_the_flavours(pages):
    path, report = pages["broken"]
    text = path.read_text()
    [changed] = [g for g in report.gelu if g["status"] == "changed"]
    assert "class='fail'>changed" in text and changed["message"].split(" (")[0] in text.replace("&#x27;", "'")
    assert "exact (source)" in text and "artifact" in text  # the plot's legend (SVG text)


@pytest.mark.parametrize("name", ["faithful", "broken"])
def test_chromium_renders_it_without_javascript_or_errors_and_draws_every_plot(pages, name, tmp_path):
    from playwright.sync_api import sync_playwright

    if CHROMIUM is None:
        tool_missing("no chromium, chromium-browser, google-chrome or chrome on PATH (Debian's chromium; "
                     ".ci/run installs it)")

    path, report = pages[name]
    messages, fetched = [], []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run"])
        try:
            page = browser.new_context(java_script_enabled=False).new_page()
            page.on("console", lambda message: messages.append(f"{message.type}: {message.text}"))
            page.on("pageerror", lambda error: messages.append(f"pageerror: {error}"))
            page.on("request", lambda request: fetched.append(request.url))
            page.goto(path.as_uri())
            boxes = [page.locator("svg").nth(i).bounding_box() for i in range(page.locator("svg").count())]
            page.screenshot(path=str(tmp_path / f"{name}.png"), full_page=True)
        finally:
            browser.close()
    assert messages == [] and fetched == [path.as_uri()]
    assert len(boxes) == len(report.outputs) + sum(bool(g.get("probes")) for g in report.gelu)
    assert all(box and box["width"] > 200 and box["height"] > 100 for box in boxes)
