"""The published course site (``make site``, ``site/build.py``), read as a learner reads it.

The test builds the REDUCED site (``--reduced``: two lessons and one exercise a language, and
every doc page) into a temporary folder, with no network (a network namespace with loopback
only, where it can make one), executing its notebooks on the CPU (about a minute
and a half on two cores, cold), and checks the files: both languages have the same pages, every
lesson shows its outputs, its widgets as snapshots and a "run it live" box, and no solution
region of ``solutions/`` appears anywhere. Then a local static server serves it, and Debian's
chromium (driven by Playwright, as in test_browser.py; never ``playwright install``) opens
every page: no console error, every image decoded, every internal link lands on a file and its
anchor, the language switch lands on the same page in the other language, and search finds
"window" in English and 窗口 in Chinese.

``SLOTMAP_SITE=_build/site`` checks a site already built instead (``make site``'s, whole),
before publishing it.

Needs the ``site`` extra (``make site-env``; ``make test`` installs it), chromium and the
playwright package. Without them the tests skip, except under CI (``CI`` set), where they fail.
"""

from __future__ import annotations

import functools
import html
import http.server
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import urllib.parse
from pathlib import Path

import pytest
from browser_lab import chromium_context

ROOT = Path(__file__).resolve().parents[1]
# site/build.py by its path, under a name of its own: "site" is the standard library's module
# and "build" a common package's name.
_spec = importlib.util.spec_from_file_location("slotmap_site_build", ROOT / "site" / "build.py")
site_build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(site_build)

UNDER_CI = bool(os.environ.get("CI"))
LANGS = ("en", "zh_CN")
BUILT = os.environ.get("SLOTMAP_SITE")  # a site already built, checked as it is
LESSONS = (
    site_build.REDUCED_LESSONS
    if not BUILT
    else tuple(p.stem for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")))
)
EXERCISES = (
    site_build.REDUCED_EXERCISES
    if not BUILT
    else tuple(p.stem for p in sorted((ROOT / "exercises").glob("[0-9][0-9]_*.ipynb")))
)
pytestmark = pytest.mark.timeout(900)


def _missing(reason: str):
    if UNDER_CI:
        pytest.fail(f"{reason} (CI is set: the site test must run in CI)", pytrace=False)
    pytest.skip(reason)


def offline(command: list[str]) -> list[str]:
    """``command`` in a network namespace of its own with loopback only (the kernels talk to
    the build over it), where ``unshare`` can make one (root, or unprivileged user namespaces):
    the build needs no network. Elsewhere, ``command`` as it is."""
    tools = shutil.which("unshare") and shutil.which("ip")
    if not tools or subprocess.run(["unshare", "-rn", "true"], capture_output=True).returncode:
        return command
    return ["unshare", "-rn", "sh", "-c", 'ip link set lo up && exec "$@"', "offline", *command]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    if BUILT:
        return (ROOT / BUILT).resolve()
    for module in ("sphinx", "myst_nb", "furo", "jieba"):
        if importlib.util.find_spec(module) is None:
            _missing(f"{module} is not installed (make site-env installs the site extra)")
    out = tmp_path_factory.mktemp("site") / "html"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    subprocess.run(
        offline([sys.executable, str(ROOT / "site" / "build.py"), "--reduced", "--out", str(out)]),
        check=True,
        cwd=ROOT,
        env=env,
        timeout=800,
    )
    return out


def text(path: Path) -> str:
    """What a page says: its HTML without tags and entities, whitespace as single spaces."""
    shown = html.unescape(re.sub(r"<[^>]+>", "", path.read_text(encoding="utf-8")))
    return re.sub(r"\s+", " ", shown)


def pages(site: Path, lang: str) -> list[str]:
    return sorted(p.relative_to(site / lang).as_posix() for p in (site / lang).rglob("*.html"))


def test_both_languages_have_the_same_pages(site):
    english = pages(site, "en")
    for page in ("index.html", "glossary.html", "semantics.html", "performance.html"):
        assert page in english
    for page in ("api.html", "site.html", "search.html"):
        assert page in english
    assert [p for p in english if p.startswith("lessons/")] == [
        f"lessons/{name}.html" for name in LESSONS
    ]
    assert [p for p in english if p.startswith("exercises/")] == [
        f"exercises/{name}.html" for name in EXERCISES
    ]
    assert pages(site, "zh_CN") == english
    assert (site / "index.html").is_file()


def test_the_chinese_pages_are_the_chinese_lessons(site):
    lesson = f"lessons/{LESSONS[0]}.html"
    chinese = (site / "zh_CN" / lesson).read_text(encoding="utf-8")
    source = json.loads((ROOT / "notebooks" / "zh_CN" / f"{LESSONS[0]}.ipynb").read_text())
    title = "".join(source["cells"][0]["source"]).splitlines()[0].lstrip("# ").strip()
    assert re.search(r"[\u4e00-\u9fff]", title), title
    assert title.split("·")[-1].strip() in chinese
    assert 'lang="zh-CN"' in chinese


def test_every_lesson_shows_its_outputs_snapshots_and_the_live_box(site):
    for lang in LANGS:
        live = site_build.TEXT[lang]["live_title"]
        for name in LESSONS:
            page = (site / lang / "lessons" / f"{name}.html").read_text(encoding="utf-8")
            shown = text(site / lang / "lessons" / f"{name}.html")
            assert live in shown and "workshop/binder" in shown and "make lab" in shown, name
            # Executed: the backend line every lesson prints.
            assert "SLOTMAP_BACKEND=cpu" in shown, name
            # Each widget the lesson shows (``paged_widget()`` ...): its figure, then the note
            # that names its settings, in one cell's output.
            source = json.loads((ROOT / "notebooks" / f"{name}.ipynb").read_text())
            code = "\n".join(
                "".join(c["source"]) for c in source["cells"] if c["cell_type"] == "code"
            )
            widgets = len(set(re.findall(r"\b(\w+_widget)\(", code)))
            outputs = re.findall(
                r'<div class="cell_output docutils container">(.*?)</div>\s*</div>', page, re.S
            )
            snapshots = [o for o in outputs if 'class="widget-snapshot-note"' in o]
            assert len(snapshots) == widgets, (lang, name)
            assert all("<img" in o for o in snapshots), (lang, name)
            assert "application/vnd.jupyter.widget" not in page, name
            assert not re.search(r"""<script[^>]+src=["']https?:""", page), name


def test_the_chinese_lessons_ran_in_chinese(site):
    name = LESSONS[0]
    english = (site / "en" / "lessons" / f"{name}.html").read_text(encoding="utf-8")
    chinese = (site / "zh_CN" / "lessons" / f"{name}.html").read_text(encoding="utf-8")
    assert "backend cpu" in english and "后端 cpu" in chinese


def test_exercises_are_stubs_with_their_failure_messages(site):
    for lang in LANGS:
        for name in EXERCISES:
            page = (site / lang / "exercises" / f"{name}.html").read_text(encoding="utf-8")
            assert "YOUR CODE HERE" in text(site / lang / "exercises" / f"{name}.html")
            # Every check cell ran, and reported failure in its red box.
            solution = (ROOT / "solutions" / f"{name}.ipynb").read_text(encoding="utf-8")
            checks = len(set(re.findall(r"check\(\\?[\"'](\d\d\.\w+)", solution)))
            assert checks and page.count("border-left: 4px solid #b3261e") >= checks, name


def test_no_solution_region_is_published(site):
    regions = site_build.solution_regions()
    assert len(regions) > 40  # every solution notebook's regions, both languages
    assert site_build.leaked_solutions(site, regions) == []


def test_a_published_solution_region_is_found(site, tmp_path):
    """The leak check itself: a solution's first region, highlighted as a code cell would be,
    pasted into a copy of the exercise's page."""
    name = EXERCISES[0]
    shutil.copytree(site / "en" / "exercises", tmp_path / "copy")
    page = tmp_path / "copy" / f"{name}.html"
    solution = (ROOT / "solutions" / f"{name}.ipynb").read_text(encoding="utf-8")
    cells = ["".join(c["source"]) for c in json.loads(solution)["cells"]]
    body = next(c for c in cells if site_build.REGION.search(c)).split("### BEGIN SOLUTION")[1]
    body = body.split("### END SOLUTION")[0]
    spans = "".join(f'<span class="n">{html.escape(w)}</span>' for w in re.split(r"(\s+)", body))
    page.write_text(page.read_text(encoding="utf-8") + f"<pre>{spans}</pre>", encoding="utf-8")
    leaks = site_build.leaked_solutions(tmp_path / "copy")
    assert any(f"solutions/{name}.ipynb" in leak and name in leak for leak in leaks), leaks


def test_docs_and_the_api_reference_are_pages(site):
    for lang in LANGS:
        glossary = (site / lang / "glossary.html").read_text(encoding="utf-8")
        assert "槽位" in glossary and "slot" in glossary
        api = (site / lang / "api.html").read_text(encoding="utf-8")
        # Generated from docstrings: a class's and a function's own entries.
        assert 'id="slotmap.layout.SlotLayout"' in api
        assert 'id="slotmap.reference.slot_mapping_oracle"' in api
        semantics = (site / lang / "semantics.html").read_text(encoding="utf-8")
        assert "slot_mapping_oracle" in semantics
        assert (site / lang / "_static" / "mathjax" / "tex-chtml.js").is_file()


def api_docstrings():
    """(name, docstring) of every module the API reference documents, and of their public
    classes, functions, methods and properties, as autodoc renders them."""
    import importlib
    import inspect

    for name in site_build.API_MODULES:
        module = importlib.import_module(name)
        yield name, inspect.getdoc(module)
        for member, value in vars(module).items():
            if member.startswith("_") or getattr(value, "__module__", None) != name:
                continue
            yield f"{name}.{member}", inspect.getdoc(value)
            for attribute, inner in vars(value).items() if inspect.isclass(value) else ():
                if not attribute.startswith("_") and (
                    inspect.isfunction(inner) or isinstance(inner, property)
                ):
                    yield f"{name}.{member}.{attribute}", inspect.getdoc(inner)


def test_every_api_docstring_is_valid_restructuredtext():
    # A docutils error renders the API page wrong, and Sphinx only warns about it.
    core = pytest.importorskip("docutils.core")
    import io

    broken = {}
    for name, doc in api_docstrings():
        warnings = io.StringIO()
        core.publish_doctree(doc or "", settings_overrides={"warning_stream": warnings})
        if warnings.getvalue():
            broken[name] = warnings.getvalue()
    assert not broken, broken


def test_the_chinese_semantics_and_performance_pages_are_the_chinese_documents(site):
    for name in ("semantics", "performance"):
        english = (ROOT / "docs" / f"{name}.md").read_text(encoding="utf-8")
        chinese = (ROOT / "docs" / f"{name}.zh-CN.md").read_text(encoding="utf-8")
        # Sphinx's smart quotes make "kernel's" "kernel’s".
        en_page = text(site / "en" / f"{name}.html").replace("’", "'")
        zh_page = text(site / "zh_CN" / f"{name}.html").replace("’", "'")
        headings = re.compile(r"^#{1,3} (.+)$", re.M)
        # Every heading in its own language, none in the other's; no "English only" note.
        for heading in headings.findall(chinese):
            assert heading in zh_page and heading not in en_page, (name, heading)
        assert re.search(r"[\u4e00-\u9fff]", headings.findall(chinese)[0]), name
        for heading in headings.findall(english):
            assert heading in en_page and heading not in zh_page, (name, heading)
        assert "本页仅有英文版" not in zh_page, name
    assert "本页仅有英文版" in text(site / "zh_CN" / "site.html")
    assert "仅有英文版" in text(site / "zh_CN" / "api.html")


def test_chinese_search_is_segmented(site):
    index = (site / "zh_CN" / "searchindex.js").read_text(encoding="utf-8")
    terms = json.loads(index[index.index("(") + 1 : index.rindex(")")])["terms"]
    assert "窗口" in terms  # a word jieba cut out of a sentence, not a whole line


# ---------------------------------------------------------------- in a real browser


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # noqa: ANN002
        pass


@pytest.fixture(scope="module")
def server(site):
    handler = functools.partial(_Quiet, directory=str(site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)


@pytest.fixture(scope="module")
def browser(site, tmp_path_factory):
    profile = tmp_path_factory.mktemp("chromium")
    with chromium_context(profile, (1280, 900), 30_000, _missing) as context:
        # Nothing from outside loopback: the site is self-contained, and a request out
        # shows up as a failed load (a console error) rather than a hang on a closed network.
        context.route(
            re.compile(r"^(?!http://127\.0\.0\.1[:/]|data:|blob:|about:).*"),
            lambda route: route.abort(),
        )
        yield context


LINKS = """() => [...document.querySelectorAll('a[href]')].map((a) => a.href)"""
IMAGES = """() => [...document.querySelectorAll('img')].map((img) =>
  [img.getAttribute('src').slice(0, 80), img.complete && img.naturalWidth > 0])"""
IDS = """() => [...document.querySelectorAll('[id]')].map((e) => e.id)"""


def _visit(context, url: str) -> tuple[object, list[str]]:
    page = context.new_page()
    problems: list[str] = []
    page.on(
        "console",
        lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None,
    )
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    response = page.goto(url, wait_until="load")
    if response is None or not response.ok:
        problems.append(f"HTTP {response.status if response else 'no response'}")
    page.wait_for_load_state("networkidle")
    return page, problems


def test_every_page_loads_with_images_and_links_in_a_browser(site, server, browser):
    failures: list[str] = []
    anchors: dict[str, set[str]] = {}
    wanted: list[tuple[str, str, str]] = []
    for lang in LANGS:
        for name in pages(site, lang):
            url = f"{server}/{lang}/{name}"
            page, problems = _visit(browser, url)
            try:
                failures += [f"{lang}/{name}: {p}" for p in problems]
                failures += [
                    f"{lang}/{name}: image {src} did not decode"
                    for src, decoded in page.evaluate(IMAGES)
                    if not decoded
                ]
                # MathJax, from the site's own _static/, typeset every formula.
                if page.locator(".math").count():
                    page.locator("mjx-container").first.wait_for(state="attached")
                    if page.locator(".math mjx-container").count() < page.locator(".math").count():
                        failures.append(f"{lang}/{name}: a formula was not typeset")
                anchors[f"/{lang}/{name}"] = set(page.evaluate(IDS))
                for link in page.evaluate(LINKS):
                    parts = urllib.parse.urlsplit(link)
                    if link.startswith(server):
                        wanted.append((f"{lang}/{name}", parts.path, parts.fragment))
            finally:
                page.close()
    for origin, path, fragment in wanted:
        target = site / urllib.parse.unquote(path).lstrip("/")
        if target.is_dir():
            target = target / "index.html"
        if not target.is_file():
            failures.append(f"{origin}: broken link to {path}")
        elif fragment and path in anchors and fragment not in anchors[path]:
            failures.append(f"{origin}: link to {path}#{fragment}, no such anchor")
    assert not failures, "\n".join(failures[:40])


def test_the_language_switch_lands_on_the_same_page(site, server, browser):
    for lang, other in (("en", "zh_CN"), ("zh_CN", "en")):
        for name in pages(site, lang):
            if name == "search.html" or name == "genindex.html":
                continue
            page, _ = _visit(browser, f"{server}/{lang}/{name}")
            try:
                label = page.inner_text(".lang-switch")
                assert label.startswith("语言：中文" if lang == "zh_CN" else "Language: English")
                page.click("#lang-switch")
                page.wait_for_load_state("load")
                assert page.url == f"{server}/{other}/{name}", (lang, name)
                html_lang = page.evaluate("() => document.documentElement.lang")
                assert html_lang == ("zh-CN" if other == "zh_CN" else "en"), (other, name)
            finally:
                page.close()


@pytest.mark.parametrize(("lang", "word"), [("en", "window"), ("zh_CN", "窗口")])
def test_search_finds_a_word(server, browser, lang, word):
    page, problems = _visit(browser, f"{server}/{lang}/search.html?q={urllib.parse.quote(word)}")
    try:
        results = page.locator("#search-results ul.search li")
        results.first.wait_for(state="attached", timeout=30_000)
        found = [results.nth(i).inner_text() for i in range(results.count())]
        assert any("03" in text for text in found), found
        assert not problems, problems
    finally:
        page.close()


def test_the_sites_root_leads_to_the_english_home(server, browser):
    page, problems = _visit(browser, f"{server}/")
    try:
        page.wait_for_url(f"{server}/en/index.html")
        assert page.locator("#lang-switch").get_attribute("href") == "../zh_CN/index.html"
        assert not problems, problems
    finally:
        page.close()


def test_the_cache_key_is_the_notebook_its_language_and_the_library(tmp_path):
    notebook = tmp_path / "lesson.ipynb"
    notebook.write_bytes((ROOT / "notebooks" / f"{LESSONS[0]}.ipynb").read_bytes())
    key = site_build.cache_key(notebook, "en", "library")
    assert key == site_build.cache_key(notebook, "en", "library")
    assert key != site_build.cache_key(notebook, "zh_CN", "library")
    assert key != site_build.cache_key(notebook, "en", "library changed")
    notebook.write_bytes(notebook.read_bytes().replace(b"# ", b"#  ", 1))
    assert key != site_build.cache_key(notebook, "en", "library")
