"""Build the course site: every lesson and exercise executed on the CPU, in English and in
Chinese, with the glossary, the library's docs and its API reference, as static HTML.

    python site/build.py                 # the whole site, into _build/site (make site)
    python site/build.py --reduced       # two lessons and one exercise a language (the test)

Steps: each notebook is executed once per language with ``SLOTMAP_BACKEND=cpu`` (and
``SLOTMAP_LANG=zh`` for Chinese) on a fresh kernel, or taken from ``_build/site-cache``, whose
key is the notebook's bytes, the language and the library's source; every widget is replaced
by a still snapshot of its figure at its default settings; a "run it live" box goes on every
lesson and exercise page. Then Sphinx (MyST-NB, furo) runs once per language on a source
folder assembled here, with execution off. Last, the built site is searched for every
solution region of ``solutions/``: one found fails the build.

MyST-NB's own cache (jupyter-cache) is not used: it runs plain nbclient in the Sphinx process
with one environment for every notebook (the language is per notebook here), keys on code
cells alone (the Chinese notebooks share the English code, not its outputs), and renders
widgets as live JavaScript from a CDN, where this site shows snapshots and needs no network.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import copy
import hashlib
import html
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BUILD = ROOT / "_build"
CACHE = BUILD / "site-cache"
LANGS = ("en", "zh_CN")
# Lessons and exercises of the reduced build (the CI test): quick ones, each with a widget.
REDUCED_LESSONS = ("01_paged_kv_cache", "03_window_gather")
REDUCED_EXERCISES = ("03_window_gather",)
# Seconds a cell may take (tests/test_notebooks.py's limit, with room for a loaded machine).
CELL_TIMEOUT = 180
# The library's API reference: the modules a learner or an engine calls, not the course's
# machinery (the grader, the workshop, the exercise checks).
API_MODULES = (
    "slotmap",
    "slotmap.layout",
    "slotmap.reference",
    "slotmap.validate",
    "slotmap.kernels",
    "slotmap.kernels.launch",
    "slotmap.serving",
    "slotmap.attention",
    "slotmap.cp",
    "slotmap.cp_attention",
    "slotmap.bench",
    "slotmap.backend",
    "slotmap.distributed",
    "slotmap.i18n",
    "slotmap.viz.live",
)
DOCS = ("glossary", "semantics", "performance", "site")
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"

TEXT = {
    "en": {
        "title": "slotmap: the KV-cache slot-mapping course",
        "intro": (
            "How LLM inference engines map each token's logical position to a physical "
            "KV-cache slot, with Triton kernels that run on NVIDIA GPUs, on Ascend NPUs and on "
            "the CPU. Every lesson below was run top to bottom on the CPU when this site was "
            "built: each output and figure is what *Run all* shows. Interactive figures appear "
            "as a snapshot at their default settings."
        ),
        "lessons": "Lessons",
        "exercises": "Exercises",
        "reference": "Reference",
        "api": "API reference",
        "api_intro": "Generated from the library's docstrings.",
        "live_title": "Run it live",
        "live": (
            "This page is the {kind} as it ran on the CPU when the site was built. To change "
            "its inputs, move its sliders and run its cells yourself, open `{path}` in "
            "JupyterLab, either:\n\n"
            "- on your workshop's **JupyterHub** (the address your organiser gives you; "
            "`workshop/README.md`);\n"
            "- on **Binder** or any BinderHub, from the image that `workshop/binder` builds;\n"
            "- on your own machine: clone the repository and run `make lab` "
            "(`make lab COURSE_LANG=zh` for the course in Chinese)."
        ),
        "lesson": "lesson",
        "exercise": "exercise",
        "exercise_note": (
            "The exercise is shown as the course ships it: every answer is a stub "
            "(`# YOUR CODE HERE`), and each check cell shows the message it gives until the "
            "stub is filled in. `make lab` copies it to `my_work/{name}` for you to solve."
        ),
        "snapshot": (
            "A still snapshot of this interactive figure at its default settings ({settings}). "
            "The live version, which redraws as you move the controls, needs a running kernel: "
            "see “Run it live” at the top of the page."
        ),
        "no_settings": "no controls",
        "untranslated": ("This page has no Chinese translation yet: it is shown in English."),
    },
    "zh_CN": {
        "title": "slotmap：KV 缓存槽位映射课程",
        "intro": (
            "LLM 推理引擎如何把每个 token 的逻辑位置映射到物理 KV 缓存槽位，配有在 NVIDIA GPU、"
            "昇腾 NPU 和 CPU 上运行的 Triton 算子。下面每一课都在构建本站时于 CPU 上从头到尾"
            "运行过：每个输出和图都与“运行所有单元格”的结果相同。交互图以默认设置下的快照显示。"
        ),
        "lessons": "课程",
        "exercises": "练习",
        "reference": "参考",
        "api": "API 参考",
        "api_intro": "由库的 docstring 生成，仅有英文版。",
        "live_title": "在线运行",
        "live": (
            "本页是构建本站时在 CPU 上运行的{kind}。要改变输入、拖动滑块、亲自运行单元格，"
            "请在 JupyterLab 中打开 `{path}`，任选其一：\n\n"
            "- 在工作坊的 **JupyterHub** 上（地址由组织者提供；见 `workshop/README.md`）；\n"
            "- 在 **Binder** 或任意 BinderHub 上，使用 `workshop/binder` 构建的镜像；\n"
            "- 在自己的机器上：克隆仓库，运行 `make lab COURSE_LANG=zh`。"
        ),
        "lesson": "课程",
        "exercise": "练习",
        "exercise_note": (
            "练习按课程发布时的样子显示：每个答案都是待填写的空位（`# YOUR CODE HERE`），"
            "每个检查单元格显示空位填好之前给出的消息。`make lab` 会把它复制到 "
            "`my_work/{name}`，供你完成。"
        ),
        "snapshot": (
            "此交互图在默认设置下的静态快照（{settings}）。随控件变化而重绘的实时版本需要运行中的"
            "内核：见本页顶部的“在线运行”。"
        ),
        "no_settings": "无控件",
        "untranslated": "本页尚无中文翻译，以英文显示。",
    },
}
ENGLISH_ONLY_NOTE = {
    "zh_CN": "本页仅有英文版。",
}
# The docs translated block by block (slotmap.translate.documents): their Chinese page is the
# built document, docs/<name>.zh-CN.md.
TRANSLATED_DOCS = ("semantics", "performance")
# A document's line that leads to its other language: the site's own switch does that.
LANGUAGE_LINK = re.compile(r"^(?:中文：|English: )\[[^\]]+\.md\]\([^)]+\.md\)\n\n", re.M)


# ---------------------------------------------------------------- sources


def notebook_sources(lang: str, reduced: bool) -> list[tuple[str, Path, bool]]:
    """(site page name, notebook, translated) of every lesson and exercise of ``lang``. A
    lesson without a built translation is shown in English (the page exists in both)."""
    pages = []
    for folder, section, keep in (
        ("notebooks", "lessons", REDUCED_LESSONS),
        ("exercises", "exercises", REDUCED_EXERCISES),
    ):
        for english in sorted((ROOT / folder).glob("[0-9][0-9]_*.ipynb")):
            if reduced and english.stem not in keep:
                continue
            translated = ROOT / folder / "zh_CN" / english.name
            if lang == "zh_CN" and translated.is_file():
                pages.append((f"{section}/{english.stem}", translated, True))
            else:
                pages.append((f"{section}/{english.stem}", english, lang == "en"))
    return pages


def library_digest() -> str:
    """A digest of the library's source: a lesson's outputs change with it."""
    digest = hashlib.sha256()
    for path in sorted((ROOT / "slotmap").rglob("*")):
        if path.is_file() and path.suffix in {".py", ".mo", ".po"}:
            digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def cache_key(notebook: Path, lang: str, library: str) -> str:
    digest = hashlib.sha256(b"site-cache v1\0" + lang.encode() + b"\0" + library.encode())
    digest.update(notebook.read_bytes())
    return digest.hexdigest()[:32]


# ---------------------------------------------------------------- execution


def execute(notebook: Path, lang: str, target: Path) -> float:
    """Run ``notebook`` top to bottom on a fresh kernel on the CPU, in ``lang``, as a learner's
    *Run all* does, and save it with its outputs and widget state to ``target``. Seconds."""
    import nbformat

    sys.path.insert(0, str(ROOT))
    from slotmap.exercises.gradeworker import client_class

    start = time.perf_counter()
    nb = nbformat.read(notebook, as_version=4)
    client = client_class()(
        nb,
        timeout=CELL_TIMEOUT,
        kernel_name="python3",
        allow_errors=True,  # an exercise's checks fail by design; a lesson's error shows
        resources={"metadata": {"path": str(notebook.parent)}},
        shutdown_kernel="immediate",
        store_widget_state=True,
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(
        SLOTMAP_BACKEND="cpu",
        SLOTMAP_LANG="zh" if lang == "zh_CN" else "en",
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
        MPLBACKEND="module://matplotlib_inline.backend_inline",
    )
    client.execute(env=env)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    nbformat.write(nb, partial)
    partial.replace(target)  # a killed build never leaves half a notebook in the cache
    return time.perf_counter() - start


def _execute_job(args: tuple[str, str, str]) -> tuple[str, float]:
    notebook, lang, target = args
    return target, execute(Path(notebook), lang, Path(target))


def executed_notebooks(
    pages: dict[str, list[tuple[str, Path, bool]]], jobs: int, log=print
) -> dict[tuple[str, Path], Path]:
    """(language, notebook) -> its executed copy in the cache, running those not cached."""
    library = library_digest()
    cached, todo = {}, []
    for lang, entries in pages.items():
        for _, notebook, _ in entries:
            target = CACHE / f"{cache_key(notebook, lang, library)}.ipynb"
            cached[(lang, notebook)] = target
            if not target.is_file() and (str(notebook), lang, str(target)) not in todo:
                todo.append((str(notebook), lang, str(target)))
    log(f"site: {len(cached) - len(todo)} notebooks cached, {len(todo)} to execute")
    if todo:
        with concurrent.futures.ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
            futures = {pool.submit(_execute_job, job): job for job in todo}
            for future in concurrent.futures.as_completed(futures):
                notebook, lang, _ = futures[future]
                _, seconds = future.result()
                log(f"site: executed {Path(notebook).relative_to(ROOT)} [{lang}] {seconds:.0f} s")
    return cached


# ---------------------------------------------------------------- widgets


def _model_refs(value) -> list[str]:  # noqa: ANN001
    if isinstance(value, str) and value.startswith("IPY_MODEL_"):
        return [value[len("IPY_MODEL_") :]]
    if isinstance(value, list | tuple):
        return [ref for item in value for ref in _model_refs(item)]
    return []


def _control_setting(state: dict) -> str | None:
    """``description = value`` of a control model, None for anything else."""
    description = state.get("description")
    if not description:
        return None
    if "_options_labels" in state and state.get("index") is not None:
        value = state["_options_labels"][state["index"]]
    elif "value" in state:
        value = state["value"]
    else:
        return None
    return f"{description} = {value}"


def widget_snapshot(model_id: str, states: dict, lang: str) -> list[dict]:
    """The outputs that stand for the widget ``model_id``: what its Output areas show at its
    default settings (the figure), then a note that names those settings and says that the
    live version needs a kernel."""
    shown, settings, seen = [], [], set()
    todo = [model_id]
    while todo:
        current = todo.pop(0)
        if current in seen or current not in states:
            continue
        seen.add(current)
        model = states[current]
        state = model.get("state", {})
        if model.get("model_name") == "OutputModel":
            shown.extend(copy.deepcopy(state.get("outputs", [])))
        setting = _control_setting(state)
        if setting:
            settings.append(setting)
        todo.extend(_model_refs(state.get("children", [])))
    words = TEXT[lang]
    note = words["snapshot"].format(settings="; ".join(settings) or words["no_settings"])
    shown.append(
        {
            "output_type": "display_data",
            "metadata": {},
            "data": {
                "text/html": f'<p class="widget-snapshot-note">{html.escape(note)}</p>',
                "text/plain": note,
            },
        }
    )
    return shown


def snapshot_widgets(nb, lang: str) -> int:  # noqa: ANN001
    """Every widget output replaced by its snapshot; the widget state dropped. Returns the
    number of widgets replaced."""
    import nbformat

    states = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    replaced = 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        outputs = []
        for output in cell.get("outputs", []):
            view = output.get("data", {}).get(WIDGET_VIEW)
            if view:
                outputs.extend(widget_snapshot(view["model_id"], states, lang))
                replaced += 1
            else:
                outputs.append(output)
        cell.outputs = [nbformat.from_dict(o) for o in outputs]
    nb.metadata.pop("widgets", None)
    return replaced


# ---------------------------------------------------------------- pages


def _markdown_cell(source: str):  # noqa: ANN202
    import nbformat

    return nbformat.v4.new_markdown_cell(source)


def prepare_page(executed: Path, source: Path, page: str, lang: str, translated: bool, dest: Path):
    """The executed notebook as a page: widgets as snapshots, the live box after its title."""
    import nbformat

    nb = nbformat.read(executed, as_version=4)
    snapshot_widgets(nb, lang)
    words = TEXT[lang]
    section, name = page.split("/")
    kind = words["lesson"] if section == "lessons" else words["exercise"]
    path = source.relative_to(ROOT).as_posix()
    box = [f":::{{admonition}} {words['live_title']}\n:class: tip\n\n"]
    box.append(words["live"].format(kind=kind, path=path))
    if section == "exercises":
        box.append("\n\n" + words["exercise_note"].format(name=f"{name}.ipynb"))
    if lang == "zh_CN" and not translated:
        box.append("\n\n" + words["untranslated"])
    box.append("\n:::")
    # After the cell that holds the title (an exercise starts with its banner, then the title).
    title = next(
        (
            i
            for i, c in enumerate(nb.cells)
            if c.cell_type == "markdown" and HEADING.search(c.source)
        ),
        0,
    )
    nb.cells.insert(title + 1, _markdown_cell("".join(box)))
    dest.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, dest)


HEADING = re.compile(r"^#{1,2} ", re.M)
REPO_LINK = re.compile(r"\[([^\]]+)\]\(((?:\.\./)[^)\s]*)\)")


def prepare_doc(name: str, lang: str, dest: Path) -> None:
    """docs/<name>.md as a page: links to repository files outside the site become the file's
    path in the repository (the site publishes only pages)."""
    source = ROOT / "docs" / f"{name}.md"
    if lang == "zh_CN" and name in TRANSLATED_DOCS:
        source = ROOT / "docs" / f"{name}.zh-CN.md"
    text = LANGUAGE_LINK.sub("", source.read_text(encoding="utf-8"))

    def repo_path(match: re.Match) -> str:
        target = match.group(2)
        path = os.path.normpath(os.path.join("docs", target)).replace(os.sep, "/")
        shown = f"`{path}`"
        return match.group(1) if match.group(1) == shown else f"{match.group(1)} ({shown})"

    text = REPO_LINK.sub(repo_path, text)
    # A link to another doc that the site does not publish: its path, as for any file.
    for other in ("translating", "headless-stall"):
        text = re.sub(rf"\[([^\]]+)\]\({other}\.md\)", rf"\1 (`docs/{other}.md`)", text)
    note = ENGLISH_ONLY_NOTE.get(lang) if name == "site" else None
    if note:
        first, rest = text.split("\n", 1)
        text = f"{first}\n\n:::{{note}}\n{note}\n:::\n{rest}"
    dest.write_text(text, encoding="utf-8")


def prepare_api(lang: str, dest: Path) -> None:
    words = TEXT[lang]
    parts = [f"# {words['api']}\n\n{words['api_intro']}\n"]
    for module in API_MODULES:
        # The package's own names are documented in their modules (one target each).
        members = "" if module == "slotmap" else "\n   :members:"
        parts.append(
            f"\n## `{module}`\n\n```{{eval-rst}}\n.. automodule:: {module}{members}\n```\n"
        )
    dest.write_text("".join(parts), encoding="utf-8")


def prepare_index(lang: str, pages: list[tuple[str, Path, bool]], dest: Path) -> None:
    words = TEXT[lang]
    lessons = [p for p, _, _ in pages if p.startswith("lessons/")]
    exercises = [p for p, _, _ in pages if p.startswith("exercises/")]

    def toctree(caption: str, entries: list[str]) -> str:
        body = "\n".join(entries)
        return f"\n```{{toctree}}\n:caption: {caption}\n:maxdepth: 1\n\n{body}\n```\n"

    text = f"# {words['title']}\n\n{words['intro']}\n"
    text += toctree(words["lessons"], lessons)
    text += toctree(words["exercises"], exercises)
    text += toctree(words["reference"], [*DOCS, "api"])
    dest.write_text(text, encoding="utf-8")


def assemble(lang: str, pages, executed, src: Path) -> None:  # noqa: ANN001
    if src.exists():
        shutil.rmtree(src)
    src.mkdir(parents=True)
    for page, notebook, translated in pages:
        prepare_page(
            executed[(lang, notebook)], notebook, page, lang, translated, src / f"{page}.ipynb"
        )
    for name in DOCS:
        prepare_doc(name, lang, src / f"{name}.md")
    prepare_api(lang, src / "api.md")
    prepare_index(lang, pages, src / "index.md")


def prune_mathjax(out: Path) -> None:
    """MathJax as the pages load it: tex-chtml.js and what it loads on demand (TeX
    extensions, the CHTML fonts, the menu's accessibility parts), not MathJax's other
    combined builds nor its SVG output (about two thirds of its 24 MB)."""
    mathjax = out / "_static" / "mathjax"
    for path in mathjax.glob("*.js"):
        if path.name != "tex-chtml.js":
            path.unlink()
    shutil.rmtree(mathjax / "output" / "svg", ignore_errors=True)


def sphinx(lang: str, src: Path, out: Path, log=print) -> None:
    env = dict(os.environ, SLOTMAP_SITE_LANG=lang, SLOTMAP_BACKEND="cpu")
    env.pop("TRITON_INTERPRET", None)
    command = [sys.executable, "-m", "sphinx", "-b", "html", "-q", "-c", str(HERE)]
    command += ["-d", str(src.parent / f"doctrees-{lang}"), str(src), str(out)]
    start = time.perf_counter()
    subprocess.run(command, env=env, check=True, cwd=ROOT)
    prune_mathjax(out)
    log(f"site: sphinx [{lang}] {time.perf_counter() - start:.0f} s")


ROOT_INDEX = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="refresh" content="0; url=en/index.html">
<title>slotmap</title></head>
<body><p><a href="en/index.html">slotmap course (English)</a> ·
<a href="zh_CN/index.html" lang="zh-CN">slotmap 课程（中文）</a></p></body></html>
"""


# ---------------------------------------------------------------- solutions never published

SKIPPED = re.compile(r"[\s*`#>|\-\[\]()!]+")
TOKEN = re.compile(r"\w+|[^\w\s]")
REGION = re.compile(
    r"(?:### BEGIN SOLUTION|<!-- BEGIN SOLUTION -->)(.*?)"
    r"(?:### END SOLUTION|<!-- END SOLUTION -->)",
    re.S,
)


def tokens(text: str, markup: bool = False) -> str:
    """Words and symbols, in order, joined by one space: layout, markdown's markup and (with
    ``markup``, for HTML) tags and entities ignored."""
    if markup:
        text = html.unescape(re.sub(r"<[^>]+>", " ", text))
    return " ".join(t for t in TOKEN.findall(text) if not SKIPPED.fullmatch(t))


def _sources(path: Path) -> list[str]:
    nb = json.loads(path.read_text(encoding="utf-8"))
    return ["".join(s) if isinstance(s, list) else s for s in (c["source"] for c in nb["cells"])]


def solution_regions(root: Path = ROOT) -> list[tuple[str, str]]:
    """(where, tokens) of every solution region of the solutions, both languages, except the
    few that the course ships as given code elsewhere (a later exercise reuses an earlier
    one's kernel): the published lessons and exercise stubs hold those already."""
    shipped = " ".join(
        f" {tokens(source)} "
        for folder in ("notebooks", "exercises")
        for path in sorted((root / folder).rglob("*.ipynb"))
        for source in _sources(path)
    )
    regions = []
    for path in sorted((root / "solutions").rglob("*.ipynb")):
        nb = json.loads(path.read_text(encoding="utf-8"))
        for index, cell in enumerate(nb["cells"]):
            source = cell["source"]
            source = "".join(source) if isinstance(source, list) else source
            for region in REGION.findall(source):
                found = tokens(region)
                if found and f" {found} " not in shipped:
                    regions.append((f"{path.relative_to(root)} cell {index}", found))
    return regions


def leaked_solutions(site: Path, regions: list[tuple[str, str]] | None = None) -> list[str]:
    """Every solution region whose words, in order, appear in a file of the built site."""
    regions = solution_regions() if regions is None else regions
    leaks = []
    for path in sorted(site.rglob("*")):
        if not path.is_file() or path.suffix not in {".html", ".js", ".json", ".txt", ".ipynb"}:
            continue
        if "_static" in path.parts:
            continue  # the theme's and MathJax's own files
        text = path.read_text(encoding="utf-8", errors="replace")
        text = f" {tokens(text, markup=path.suffix == '.html')} "
        for where, region in regions:
            if f" {region} " in text:
                leaks.append(f"{where} appears in {path.relative_to(site)}")
    return leaks


# ---------------------------------------------------------------- the build


def build(out: Path, reduced: bool = False, jobs: int = 0, log=print) -> Path:
    start = time.perf_counter()
    jobs = jobs or (os.cpu_count() or 1)
    pages = {lang: notebook_sources(lang, reduced) for lang in LANGS}
    executed = executed_notebooks(pages, jobs, log)
    work = Path(tempfile.mkdtemp(prefix="site-src-", dir=BUILD))
    try:
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        for lang in LANGS:
            assemble(lang, pages[lang], executed, work / lang)
            sphinx(lang, work / lang, out / lang, log)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    (out / "index.html").write_text(ROOT_INDEX, encoding="utf-8")
    (out / ".nojekyll").write_text("")  # GitHub Pages: serve _static/ as it is
    leaks = leaked_solutions(out)
    if leaks:
        raise SystemExit("site: solutions in the built site:\n  " + "\n  ".join(leaks))
    log(f"site: {out} built in {time.perf_counter() - start:.0f} s")
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=BUILD / "site")
    parser.add_argument("--reduced", action="store_true", help="two lessons, one exercise")
    parser.add_argument("--jobs", type=int, default=0, help="notebooks executed at once")
    args = parser.parse_args(argv)
    BUILD.mkdir(exist_ok=True)
    build(args.out.resolve(), reduced=args.reduced, jobs=args.jobs)


if __name__ == "__main__":
    main()
