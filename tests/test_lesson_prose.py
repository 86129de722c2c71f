"""Lesson prose and code that a learner reads before the exercises: no lesson hands out an
exercise's answer (neither a solution region's code nor the printed source of the library's
version of it), and every measured number in a lesson's prose comes from the committed
benchmark results."""

from __future__ import annotations

import ast
import copy
import inspect
import io
import json
import re
import textwrap
import tokenize
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest

from slotmap.exercises.build import (
    BEGIN,
    END,
    MD_BEGIN,
    MD_END,
    _source,
    exercise_notebook,
    solution_notebooks,
)
from slotmap.exercises.grade import expected_exercises

ROOT = Path(__file__).resolve().parents[1]
LESSONS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
# A printed source that holds this share of an answer's 4-token sequences hands it out.
COVERAGE_LIMIT = 0.4


@dataclass(frozen=True)
class Answer:
    """One solution region: the exercise notebook's number, the function it sits in, its text."""

    lesson: str
    where: str
    function: str
    text: str
    kind: str  # "code" or "markdown"


def _code_regions(source: str) -> list[str]:
    """The code between each BEGIN/END pair, the lines build.cut_code removes."""
    regions, current, inside = [], [], False
    for line in source.split("\n"):
        stripped = line.strip()
        if stripped.startswith(BEGIN):
            inside, current = True, []
        elif stripped.startswith(END):
            inside = False
            regions.append(textwrap.dedent("\n".join(current)))
        elif inside:
            current.append(line)
    return regions


def _markdown_regions(source: str) -> list[str]:
    return [part.partition(MD_END)[0] for part in source.split(MD_BEGIN)[1:]]


def _enclosing_function(source: str) -> str:
    """The name of the function a solution cell defines (the one the learner completes); an
    IPython magic line (``%%writefile``) is not Python and is left out."""
    stubbed = "\n".join(
        line
        for line in source.split("\n")
        if line.strip() not in (BEGIN, END) and not line.startswith(("%", "!"))
    )
    names = [n.name for n in ast.walk(ast.parse(stubbed)) if isinstance(n, ast.FunctionDef)]
    return names[0] if names else ""


def answers() -> list[Answer]:
    """Every solution region of every solution notebook, found the way the build finds them."""
    found = []
    for path in solution_notebooks(ROOT / "solutions"):
        for index, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
            source, where = _source(cell), f"{path.name}, cell {index}"
            if cell["cell_type"] == "code" and BEGIN in source:
                function = _enclosing_function(source)
                for text in _code_regions(source):
                    found.append(Answer(path.name[:2], where, function, text, "code"))
            elif cell["cell_type"] == "markdown" and MD_BEGIN in source:
                for text in _markdown_regions(source):
                    found.append(Answer(path.name[:2], where, "", text, "markdown"))
    return found


def lesson_cells(path: Path) -> list[tuple[int, str, str]]:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return [(index, cell["cell_type"], _source(cell)) for index, cell in enumerate(cells)]


def squeeze(text: str) -> str:
    """Whitespace normalised: every run of blanks and line breaks is one space."""
    return " ".join(text.split())


def tokens(source: str) -> list[str]:
    """Python tokens without comments and layout, so formatting never hides a copy."""
    out = []
    readline = io.StringIO(textwrap.dedent(source)).readline
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
    for token in tokenize.generate_tokens(readline):
        if token.type not in skip and token.type != tokenize.ENDMARKER:
            out.append(token.string)
    return out


def coverage(answer: str, printed: str, n: int = 4) -> float:
    """The share of the answer's n-token sequences that also occur in ``printed``."""

    def grams(words: list[str]) -> set[tuple[str, ...]]:
        return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}

    wanted = grams(tokens(answer))
    return len(wanted & grams(tokens(printed))) / len(wanted) if wanted else 0.0


def short_name(name: str) -> str:
    """A function's name without leading underscores and a ``_kernel`` suffix."""
    return name.strip("_").removesuffix("_kernel")


def printed_sources(path: Path) -> list[tuple[int, str, object]]:
    """Each ``inspect.getsource(x)`` in the lesson: the cell, the expression, the object,
    resolved with the lesson's own slotmap imports."""
    namespace: dict = {}
    exec("import slotmap", namespace)  # noqa: S102 - the lesson's own imports, nothing else
    found = []
    for index, kind, source in lesson_cells(path):
        if kind != "code":
            continue
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import | ast.ImportFrom) and "slotmap" in ast.unparse(node):
                exec(ast.unparse(node), namespace)  # noqa: S102
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "inspect.getsource":
                expression = ast.unparse(node.args[0])
                found.append((index, expression, eval(expression, namespace)))  # noqa: S307
    return found


ANSWERS = answers()


def test_the_solutions_have_answers_to_hide():
    """The tests below search for something: every exercise notebook's regions are found."""
    lessons = {answer.lesson for answer in ANSWERS if answer.kind == "code"}
    assert lessons == {p.name[:2] for p in solution_notebooks(ROOT / "solutions")}
    assert {"first_kernel", "window_kernel", "reshape_and_cache_kernel", "merge"} <= {
        answer.function for answer in ANSWERS
    }


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
def test_no_lesson_cell_contains_a_solution_region(path):
    leaks = []
    for index, kind, source in lesson_cells(path):
        for answer in ANSWERS:
            if answer.kind == kind and squeeze(answer.text) in squeeze(source):
                leaks.append(f"cell {index} holds the answer of {answer.where}")
    assert leaks == []


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
def test_no_lesson_prints_the_source_of_an_answer(path):
    """A lesson may print library code, but not the library's version of a function that its
    own exercise, or a later one, asks the learner to write: one with the same name (less
    underscores and ``_kernel``), or one whose source holds most of the answer's code."""
    lesson, leaks = path.name[:2], []
    for index, expression, target in printed_sources(path):
        printed = inspect.getsource(target)
        name = short_name(getattr(target, "__name__", ""))
        for answer in ANSWERS:
            if answer.kind != "code" or answer.lesson < lesson:
                continue  # an earlier exercise's answer is the learner's own work by now
            same_name = answer.function and name == short_name(answer.function)
            share = coverage(answer.text, printed)
            if same_name or share >= COVERAGE_LIMIT:
                leaks.append(
                    f"cell {index} prints {expression}: the answer of {answer.where} "
                    f"({answer.function}; {share:.0%} of its code)"
                )
    assert leaks == []


# ---------------------------------------------------------------------------------------------
# Numbers in the prose
# ---------------------------------------------------------------------------------------------
RESULTS = ROOT / "benchmarks" / "results"
# A measurement is a device's time or rate: a number (or the two ends of a range, "18 to 28")
# written with one of these units. Sizes (bytes, tokens, blocks, 2^24), counts, ratios that
# a cell prints, and the lessons' own CPU run times in seconds are not.
UNITS = {"µs": "time", "us": "time", "GB/s": "rate"}
NUMBER = r"(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?"
MEASURED = re.compile(
    rf"(?<![\w.#]){NUMBER}(?:(?:\s+to\s+|\s*[-–]\s*){NUMBER})?(?:\s|\u00a0)*(µs|us\b|GB/s|TB/s)"
)
# A sentence or table row that names a published source quotes it: not ours to measure.
QUOTED = re.compile(r"PR #\d+|vllm-ascend measured")
SENTENCE = re.compile(r"(?<=[.:;])\s+(?=[A-Z(*`$])")


def _walk(node, key: str, found: dict[str, set[float]]) -> None:
    if isinstance(node, dict):
        for name, value in node.items():
            _walk(value, name, found)
    elif isinstance(node, list):
        for value in node:
            _walk(value, key, found)
    elif isinstance(node, str):  # a summary line, e.g. a target's "<= 1.5 us"
        found["time"].update(float(m) for m in re.findall(r"(\d+(?:\.\d+)?) ?(?:us|µs)", node))
    elif isinstance(node, int | float) and not isinstance(node, bool):
        if key == "us" or key.endswith("_us"):
            found["time"].add(float(node))
        elif key.endswith("gbps"):
            found["rate"].add(float(node))


def committed_values(files: list[Path]) -> dict[str, set[float]]:
    """The times (µs) and rates (GB/s) these results files hold: a JSON's records, a log's
    lines (the microkernel ladder exists only as ``sweep*.log``)."""
    found: dict[str, set[float]] = {"time": set(), "rate": set()}
    for path in files:
        if path.suffix == ".json":
            _walk(json.loads(path.read_text(encoding="utf-8")), "", found)
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for match in re.finditer(r"(\d+\.\d+|\d+)\s*(us|µs)\b", text):
            found["time"].add(float(match.group(1)))
        for match in re.finditer(r"(\d+\.\d+|\d+)\s*GB/s", text):
            found["rate"].add(float(match.group(1)))
    return found


CURRENT = RESULTS / "h200.json"
NAMED = re.compile(r"(?:benchmarks/)?(?:results/)?((?:[\w.-]+/)?[\w.-]+)\.(?:md|json|log)\b")


def sources(sentence: str) -> list[Path]:
    """The results a sentence names (``h200-runs/run3-request-grid.md``: that run's .json and
    .log); a sentence that names none speaks of the current run, ``h200.json``."""
    named = []
    for match in NAMED.finditer(sentence):
        stem = match.group(1)
        named += [
            p
            for p in RESULTS.rglob("*")
            if p.suffix in (".json", ".log")
            and str(p.relative_to(RESULTS).with_suffix("")).endswith(stem)
        ]
    return sorted(set(named)) or [CURRENT]


def _value(whole: str, fraction: str | None) -> tuple[float, int]:
    fraction = fraction or ""
    return float(whole.replace(",", "") + fraction), max(len(fraction) - 1, 0)


def measured_numbers(path: Path) -> list[tuple[int, str, str, float, int, list[Path]]]:
    """(cell, as written, unit kind, value, decimals, the results it must come from) for each
    measurement in the lesson's markdown, sentence by sentence (a table row is a sentence),
    quoted sentences left out."""
    found = []
    for index, kind, source in lesson_cells(path):
        if kind != "markdown":
            continue
        rows = [line for line in source.split("\n") if line.lstrip().startswith("|")]
        prose = " ".join(line for line in source.split("\n") if line not in rows)
        for sentence in rows + SENTENCE.split(prose):
            if QUOTED.search(sentence):
                continue
            for match in MEASURED.finditer(sentence):
                unit = UNITS.get(match.group(5), "unknown")
                for whole, fraction in (match.group(1, 2), match.group(3, 4)):
                    if whole:
                        value, decimals = _value(whole, fraction)
                        found.append(
                            (index, match.group(0), unit, value, decimals, sources(sentence))
                        )
    return found


def test_the_number_finder_finds_numbers(tmp_path):
    """The rule below checks something: it sees units, ranges, thousands separators and
    decimals as lessons write them, and skips quoted sources."""
    lesson = tmp_path / "99_demo.ipynb"
    cells = [
        {
            "cell_type": "markdown",
            "metadata": {},
            "source": (
                "It took 3,957 GB/s and 12.72 µs. Eager: 18 to 28 µs a call, at 4 TB/s. "
                "In PR #1 it took 173.1 µs.\n| shape | 2.05 µs |\n| other | 3.02 µs (PR #2) |"
            ),
        }
    ]
    lesson.write_text(json.dumps({"cells": cells}), encoding="utf-8")
    assert [(w, u, v, d) for _, w, u, v, d, _ in measured_numbers(lesson)] == [
        ("2.05 µs", "time", 2.05, 2),
        ("3,957 GB/s", "rate", 3957.0, 0),
        ("12.72 µs", "time", 12.72, 2),
        ("18 to 28 µs", "time", 18.0, 0),
        ("18 to 28 µs", "time", 28.0, 0),
        ("4 TB/s", "unknown", 4.0, 0),
    ]


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
def test_every_measured_number_in_the_prose_is_in_the_committed_results(path):
    """A time or rate a lesson states as measured must be one that the results its sentence
    names (else the current run, h200.json) hold, at the precision written; TB/s is never
    one: write GB/s. Anything computed from them (ratios, sums, a model's prediction) is
    printed by a cell instead."""
    stale = []
    for index, written, unit, value, decimals, files in measured_numbers(path):
        values = committed_values(files).get(unit, set())
        if not any(round(v, decimals) == value for v in values):
            named = ", ".join(str(f.relative_to(RESULTS)) for f in files)
            stale.append(f"cell {index}: {written} ({value}) is not in {named}")
    assert stale == []


# ---------------------------------------------------------------------------------------------
# Predict, then look
# ---------------------------------------------------------------------------------------------
FIGURE = re.compile(r"\b(?:draw_\w+|\w*_widget)\(")


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
def test_every_figure_and_widget_comes_with_a_prediction(path):
    """Before each figure or widget a one-line "Predict:" prompt, and the answer below it in
    a collapsed <details> block, so the learner commits to a guess before looking."""
    cells = lesson_cells(path)
    missing = []
    for position, (index, kind, source) in enumerate(cells):
        code = "\n".join(
            line
            for line in source.split("\n")
            if not line.lstrip().startswith(("#", "from ", "import "))
        )
        if kind != "code" or not FIGURE.search(code):
            continue
        before = cells[position - 1] if position else (None, "", "")
        after = cells[position + 1] if position + 1 < len(cells) else (None, "", "")
        if not (before[1] == "markdown" and before[2].startswith("**Predict:**")):
            missing.append(f"cell {index}: no **Predict:** line before it")
        if not (after[1] == "markdown" and after[2].lstrip().startswith("<details>")):
            missing.append(f"cell {index}: no <details> answer after it")
    assert missing == []


# A prediction is worth something only if the learner commits before seeing the answer: nothing
# between the start of the prompt's section and the prompt may state what its <details> answer
# says. An answer's key facts: its numbers of two or more digits (and negative ones), each number
# with the word beside it ("rank 1", "slot 46"), its runs of three words that start and end with
# a word that means something ("next free slot"), and its code spans (`PAD_ID`). A fact the
# prompt itself states is given, not answered; a phrase of words alone that the lesson used
# before the section is its vocabulary.
NUMBER_WORDS = {
    word: n
    for n, word in enumerate("zero one two three four five six seven eight nine ten".split())
}
STOP_WORDS = set(
    "a an the of to in on at is are be it its and or by for with as that this which what how "
    "from each every their there then than not no".split()
)
HEADING = re.compile(r"^#{1,3} ", re.MULTILINE)


def words(text: str) -> list[list[str]]:
    """Lower-case words and numbers, clause by clause (a phrase never spans a comma, a colon or
    a list's number); LaTeX commands and their subscripts, HTML tags and possessives dropped;
    number words as digits ("Three" is "3")."""
    text = re.sub(r"<[^>]+>|\\[a-zA-Z]+|_\w|['’]s\b", " ", text.lower())
    clauses = re.split(r"[,;:!?()\n]|\.(?!\d)", text)
    found = [re.findall(r"-?\d+(?:\.\d+)?|[a-z][\w-]*", clause) for clause in clauses]
    return [[str(NUMBER_WORDS.get(w, w)) for w in clause] for clause in found if clause]


def _is_number(word: str) -> bool:
    return re.fullmatch(r"-?\d+(?:\.\d+)?", word) is not None


def ngrams(w: list[str], n: int) -> list[tuple[str, ...]]:
    return [tuple(w[i : i + n]) for i in range(len(w) - n + 1)]


def phrases(text: str) -> set[tuple[str, ...]]:
    """Every word, pair and triple of words of ``text`` inside a clause, and its code spans."""
    found = {(f"`{span}`",) for span in re.findall(r"`([^`]+)`", text)}
    for w in words(text):
        found |= set(ngrams(w, 1)) | set(ngrams(w, 2)) | set(ngrams(w, 3))
    return found


def key_facts(answer: str) -> set[tuple[str, ...]]:
    facts = {(f"`{span}`",) for span in re.findall(r"`([^`]+)`", answer)}
    for w in words(answer.replace("Answer", "")):
        facts |= {(x,) for x in w if _is_number(x) and (len(x.lstrip("-")) > 1 or x[0] == "-")}
        facts |= {  # a number and its noun; a one-letter name is a formula's, not a finding's
            (a, b)
            for a, b in ngrams(w, 2)
            if _is_number(a) != _is_number(b)
            and not {a, b} & STOP_WORDS
            and len(b if _is_number(a) else a) > 1
        }
        facts |= {
            g
            for g in ngrams(w, 3)
            if not any(map(_is_number, g)) and g[0] not in STOP_WORDS and g[2] not in STOP_WORDS
        }
    return facts


def answered_before_asked(texts: list[tuple[str, str]]) -> list[str]:
    """For a lesson as (kind, text) per cell (a code cell's text may include its outputs):
    each prompt whose answer's facts appear between its section's heading and the prompt."""
    found = []
    for index, (kind, text) in enumerate(texts):
        if kind != "markdown" or not text.startswith("**Predict:**"):
            continue
        answer = next(t for k, t in texts[index:] if t.lstrip().startswith("<details>"))
        start = max(
            (i for i in range(index) if texts[i][0] == "markdown" and HEADING.search(texts[i][1])),
            default=0,
        )
        vocabulary = {  # cell by cell: a stray backtick in one never pairs with the next
            p for _, t in texts[:start] for p in phrases(t) if not any(map(_is_number, p))
        }
        facts = key_facts(answer) - phrases(text) - vocabulary
        heading = list(HEADING.finditer(texts[start][1]))
        after_heading = texts[start][1][heading[-1].start() :] if heading else texts[start][1]
        above = [after_heading] + [t for _, t in texts[start + 1 : index]]
        before = set().union(*map(phrases, above))
        if facts & before:
            said = sorted(" ".join(fact) for fact in facts & before)
            found.append(f"cell {index}: {text.splitlines()[0][:60]!r} answered above by {said}")
    return found


def test_the_answer_finder_sees_an_answer_given_above_its_prompt():
    """The rule below checks something: a figure's description that states the answer, the
    output's numbers, or the same finding in other words' order is seen; a section that only
    sets the scene is not."""
    prompt = "**Predict:** Which slot does position 13 take in a ring of 8?"
    answer = "<details><summary>Answer</summary>\n\nSlot 29; it overwrote position 5.\n</details>"
    for above, leaked in [
        ("## The ring\nOne request decoding position 13, a ring of 8 slots.", False),
        ("## The ring\nPosition 13 lands in slot 29.", True),
        ("## The ring\nIt overwrote position 5, which left the window.", True),
        ("## The ring\nIts slot is $3 \\cdot 8 + 13 \\bmod 8 = 29$.", True),
    ]:
        cells = [
            ("markdown", above),
            ("markdown", prompt),
            ("code", "draw()"),
            ("markdown", answer),
        ]
        assert bool(answered_before_asked(cells)) == leaked, above
    # Words the lesson used before the section are its vocabulary; numbers never are.
    earlier = [("markdown", "# 04\nA ring holds the whole sliding window, slot 29.")]
    cells = [("markdown", "## The ring\nThe whole sliding window: slot 29."), ("markdown", prompt)]
    answer_words = "<details>\n\nThe whole sliding window, slot 29.\n</details>"
    assert answered_before_asked([*earlier, *cells, ("markdown", answer_words)]) == [
        "cell 2: '**Predict:** Which slot does position 13 take in a ring of 8' answered "
        "above by ['29', 'slot 29']"
    ]


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
def test_no_prediction_is_answered_before_it_is_asked(path):
    texts = [(kind, source) for _, kind, source in lesson_cells(path)]
    assert answered_before_asked(texts) == []


# ---------------------------------------------------------------------------------------------
# Things the lessons say: the import, the targets, which lesson taught what, vLLM's versions
# ---------------------------------------------------------------------------------------------
def markdown_sentences(path: Path) -> list[tuple[int, str]]:
    return [
        (index, sentence)
        for index, kind, source in lesson_cells(path)
        if kind == "markdown"
        for sentence in SENTENCE.split(squeeze(source))
    ]


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
def test_the_course_import_is_what_chooses_the_backend(path):
    """Since 0.2.0 ``import slotmap`` has no side effects: a sentence that ties the backend's
    choice (or the order of imports before a kernel) to an import names ``slotmap.course``."""
    claims = re.compile(r"\b(?:choose|chooses|chosen|choice|picks?)\b|\bbefore decorat")
    wrong = [
        f"cell {index}: {sentence}"
        for index, sentence in markdown_sentences(path)
        if re.search(r"\bimport", sentence, re.IGNORECASE)
        and claims.search(sentence)
        and "slotmap.course" not in sentence
    ]
    assert wrong == []


TARGET = re.compile(
    r"(\d+(?:\.\d+)?)\s*µs target"
    r"|targets?\b.{0,60}?\b(?:is|of|at|to)\s+(\d+(?:\.\d+)?)\s*µs"
)


def stated_targets() -> list[tuple[str, int, float]]:
    """(lesson, cell, µs) for each time a lesson states as a target."""
    return [
        (path.name[:2], index, float(match.group(1) or match.group(2)))
        for path in LESSONS
        for index, sentence in markdown_sentences(path)
        for match in TARGET.finditer(sentence)
    ]


def test_every_target_a_lesson_states_is_the_benchmarks_own():
    """The targets are defined once, in ``slotmap.bench`` (docs/performance.md says why): a
    lesson that states one states that value, and lesson 08 states decode256's."""
    from slotmap.bench import LATENCY_TARGETS

    said = stated_targets()
    assert [s for s in said if s[2] not in LATENCY_TARGETS.values()] == []
    assert ("08", LATENCY_TARGETS["decode256"]) in {(lesson, us) for lesson, _, us in said}


def test_the_target_finder_finds_targets():
    for sentence, value in [
        ("the 1.5 µs target lies below the chain", 1.5),
        ("The project's targets (`docs/performance.md`) set decode256 at 1.5 µs", 1.5),
        ("1.75 µs on decode256, against a target of 1.68 µs", 1.68),
    ]:
        (match,) = TARGET.finditer(sentence)
        assert float(match.group(1) or match.group(2)) == value
    assert list(TARGET.finditer("the kernel reaches 1.75 µs on decode256")) == []


def first_lessons() -> dict[str, str]:
    """Each code span of the lessons (`token_slot`) -> the first lesson that shows it."""
    first: dict[str, str] = {}
    for path in LESSONS:
        for _, _, source in lesson_cells(path):
            for name in re.findall(r"`(?:slotmap\.)?(\w+)`|slotmap\.(\w+)\(", source):
                first.setdefault(name[0] or name[1], path.name[:2])
    return first


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
def test_a_lesson_names_the_lesson_it_builds_on(path):
    """ "lesson NN's `name`" credits the lesson that introduced `name`; and a lesson that points
    elsewhere names the lesson ("lesson 05"), never "a later lesson"."""
    first, wrong = first_lessons(), []
    for index, sentence in markdown_sentences(path):
        for lesson, name in re.findall(r"lesson (\d\d)'s `(?:slotmap\.)?(\w+)`", sentence):
            if first.get(name, lesson) != lesson:
                wrong.append(f"cell {index}: lesson {lesson}'s `{name}` (lesson {first[name]})")
        if re.search(r"\b(?:a later|an earlier|another) lesson\b", sentence):
            wrong.append(f"cell {index}: {sentence}")
    assert wrong == []


def test_lesson_06_says_which_vllm_passes_kernel_block_sizes():
    """vLLM up to 0.31 passes ``kernel_block_sizes`` (its tables count kernel blocks inside the
    allocation blocks); 0.32 to 0.34 dropped it (tables count allocation blocks, slotmap's
    ``kernel_block_sizes=None``): the lesson says so, and no lesson or doc claims production
    has "the same five" switches."""
    (lesson,) = [p for p in LESSONS if p.name.startswith("06")]
    text = squeeze(" ".join(s for _, kind, s in lesson_cells(lesson) if kind == "markdown"))
    assert re.search(r"vLLM up to 0\.31 passes it", text)
    assert re.search(r"vLLM 0\.32 to 0\.34 dropped it", text)
    assert "`kernel_block_sizes=None`" in text
    docs = [*LESSONS, *(ROOT / "docs").glob("*.md"), ROOT / "README.md"]
    assert [d.name for d in docs if "same five" in squeeze(d.read_text(encoding="utf-8"))] == []


# ---------------------------------------------------------------------------------------------
# Time, said once and the same everywhere
# ---------------------------------------------------------------------------------------------
HEADER_TIME = re.compile(r"\*Time:\* this notebook runs top to bottom in about (\d+) s")
EXERCISE_TIME = re.compile(r"Its exercises take about (\d+) minutes")


def header_times() -> dict[str, tuple[int, int | None]]:
    """Each lesson's header: (seconds to run, minutes for its exercises or None)."""
    times = {}
    for path in LESSONS:
        header = lesson_cells(path)[0][2]
        run, exercises = HEADER_TIME.search(header), EXERCISE_TIME.search(header)
        times[path.name[:2]] = (
            int(run.group(1)) if run else 0,
            int(exercises.group(1)) if exercises else None,
        )
    return times


def minutes_an_exercise() -> dict[str, float]:
    """Each lesson's estimate for its exercises over how many its solution checks."""
    counts = {
        p.name[:2]: len(expected_exercises(p)) for p in solution_notebooks(ROOT / "solutions")
    }
    return {
        lesson: minutes / counts[lesson]
        for lesson, (_, minutes) in header_times().items()
        if minutes is not None
    }


def test_each_lesson_header_states_its_run_time_and_its_exercises_time():
    exercised = {p.name[:2] for p in solution_notebooks(ROOT / "solutions")}
    for lesson, (seconds, minutes) in header_times().items():
        assert seconds > 0, f"lesson {lesson}'s header does not say how long it runs"
        assert (minutes is not None) == (lesson in exercised), f"lesson {lesson}: {minutes}"
    # An estimate (nobody was timed doing them): 3 to 12 minutes an exercise.
    assert all(3 <= each <= 12 for each in minutes_an_exercise().values()), minutes_an_exercise()


# What benchmarks/lesson_times.py measured; a header says it in either language.
LESSON_TIMES = ROOT / "benchmarks" / "results" / "lesson-times.json"
STATED_RUN_TIME = re.compile(r"runs top to bottom in about (\d+) s|从头到尾运行约 (\d+) 秒")


def stated_run_times() -> dict[str, int]:
    """Every notebook whose header says how long it runs, English and Chinese: path -> s."""
    stated = {}
    for folder in ("notebooks", "solutions", "exercises"):
        for path in sorted((ROOT / folder).rglob("[0-9][0-9]_*.ipynb")):
            found = STATED_RUN_TIME.search(lesson_cells(path)[0][2])
            if found:
                stated[str(path.relative_to(ROOT))] = int(found.group(1) or found.group(2))
    return stated


def test_every_header_states_the_run_time_measured_for_it():
    """A header's run time is the faster run benchmarks/lesson_times.py recorded for that
    notebook, in both languages; and every notebook measured says it in both."""
    measured = json.loads(LESSON_TIMES.read_text(encoding="utf-8"))["notebooks"]
    stated = stated_run_times()
    wrong = {
        path: (seconds, measured.get(Path(path).stem, {}).get("seconds"))
        for path, seconds in stated.items()
        if seconds != measured.get(Path(path).stem, {}).get("seconds")
    }
    assert wrong == {}, f"stated, measured: {wrong}"
    for stem in measured:
        languages = {"zh_CN" in path for path in stated if Path(path).stem == stem}
        assert languages == {False, True}, f"{stem} does not state its run time in both languages"


def test_the_capstone_states_its_run_time_and_its_exercises_time():
    """The capstone has no lesson: its own header says how long it runs and how long its
    exercises take, held to the lessons' 3 to 12 minutes an exercise."""
    capstone = ROOT / "solutions" / "09_capstone.ipynb"
    header = lesson_cells(capstone)[0][2]
    run, exercises = HEADER_TIME.search(header), EXERCISE_TIME.search(header)
    assert run and exercises, "the capstone's header states no time"
    assert 3 <= int(exercises.group(1)) / len(expected_exercises(capstone)) <= 12


def test_the_readme_says_what_the_lessons_say():
    """The README's range of lesson times is the headers' range, and its rank-cell times are
    the ones lessons 05 and 07 give next to those cells."""
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    seconds = [s for s, _ in header_times().values()]
    assert f"runs top to bottom in {min(seconds)} to {max(seconds)} s" in readme
    minutes = [m for _, m in header_times().values() if m is not None]
    each = [round(m) for m in minutes_an_exercise().values()]
    said = f"({min(minutes)} to {max(minutes)} minutes a lesson, {min(each)} to {max(each)} an"
    assert said in readme
    said = {}
    for lesson in ("05", "07"):
        (path,) = [p for p in LESSONS if p.name.startswith(lesson)]
        cells = [squeeze(s) for _, kind, s in lesson_cells(path) if kind == "markdown"]
        (cell,) = [c for c in cells if "The next cell took" in c]
        # "took 2.3 s ... (...; the two rank cells after it 0.3 and 0.1 s)": in order.
        took = cell[cell.index("The next cell took") :]
        said[lesson] = re.findall(r"(?<![\d.])(\d+(?:\.\d+)?)(?= s\b| and \d)", took)
    first, *rest = said["05"]
    assert len(said["05"]) == 3 and len(said["07"]) == 1, said
    assert f"took {first}, {rest[0]} and {rest[1]} s and lesson 07's one {said['07'][0]} s" in (
        readme
    )


# ---------------------------------------------------------------------------------------------
# Exercises that restate their own answer
# ---------------------------------------------------------------------------------------------
# A formula in an exercise's prose (a math or code span, a code comment) restates an answer
# when it has the shape of an expression of that exercise's solution region, names aside:
# `next_pow2(cdiv(TILE, block_size) + 1)` is `triton.next_power_of_2(triton.cdiv(t, b) + 1)`,
# `G\,(8N + 4M)` is `groups * (8 * num_tokens + 4 * max_num_tokens)`. Each name in the prose
# stands for any subexpression of the answer; numbers must agree. A shape of one operator
# (`x + 1`) is too common to mean anything: a leak has at least this many.
FORMULA_OPERATORS = 2
LATEX = [
    (r"\\(?:text|mathrm|operatorname|mathit)\{([^{}]*)\}", r"\1"),
    (r"\\_", "_"),
    (r"\\(?:,|;|!|quad| )", " "),
    (r"\\(?:le|leq)\b", "<="),
    (r"\\(?:ge|geq)\b", ">="),
    (r"\\(?:cdot|times)\b", "*"),
    (r"\\frac\{([^{}]*)\}\{([^{}]*)\}", r"((\1)/(\2))"),
    (r"\\(max|min|log|exp)\b", r"\1"),
    (r"\^", "**"),
    (r"[{]", "("),
    (r"[}]", ")"),
    (r"\\left|\\right", ""),
]
PROSE_TOKEN = re.compile(r"\d+(?:\.\d+)?(?:e-?\d+)?|[A-Za-z_]\w*|\*\*|[<>=!]=|\S")


def latex_to_python(math: str) -> str:
    """A LaTeX formula as a Python expression: `G\\,(8N + 4M)` -> `G * (8 * N + 4 * M)`.
    A name written right against `(` is a call; with a space between, a product."""
    for pattern, replacement in LATEX:
        math = re.sub(pattern, replacement, math)
    out, previous, spaced = [], "", False
    for match in PROSE_TOKEN.finditer(math):
        token = match.group(0)
        spaced = match.start() > 0 and math[match.start() - 1].isspace()
        operand_before = previous[:1].isalnum() or previous[:1] == "_" or previous == ")"
        operand_now = token[:1].isalnum() or token[:1] == "_" or token == "("
        call = token == "(" and not spaced and previous[:1].isalpha()
        if operand_before and operand_now and not call:
            out.append("*")
        out.append(token)
        previous = token
    return " ".join(out)


def _shape(node: ast.AST):
    """An expression's shape: names, attributes and subscripts are wildcards (None), numbers
    stay, `a >= b` is `b <= a`, `a <= b < c` is `a <= b` and `b < c`, `&` is `and`."""
    if isinstance(node, ast.Name | ast.Attribute | ast.Subscript):
        return None
    if isinstance(node, ast.Constant):
        return ("const", node.value)
    if isinstance(node, ast.UnaryOp):
        if isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
            return ("const", -node.operand.value)
        return (type(node.op).__name__, _shape(node.operand))
    if isinstance(node, ast.BinOp):
        if isinstance(node.op, ast.BitAnd):
            return ("and", _shape(node.left), _shape(node.right))
        return (type(node.op).__name__, _shape(node.left), _shape(node.right))
    if isinstance(node, ast.BoolOp):
        shapes = [_shape(value) for value in node.values]
        while len(shapes) > 2:
            shapes[-2:] = [("and", shapes[-2], shapes[-1])]
        return ("and", *shapes)
    if isinstance(node, ast.Compare):
        flip = {"Gt": "Lt", "GtE": "LtE"}
        pairs = []
        left = node.left
        for op, right in zip(node.ops, node.comparators, strict=True):
            name = type(op).__name__
            a, b = (right, left) if name in flip else (left, right)
            pairs.append((flip.get(name, name), _shape(a), _shape(b)))
            left = right
        return pairs[0] if len(pairs) == 1 else ("and", *pairs)
    if isinstance(node, ast.Call):
        return ("call", *(_shape(arg) for arg in node.args))
    return ("other", type(node).__name__)


def _operators(shape) -> int:
    if shape is None or shape[0] in ("const", "other"):
        return 0
    return 1 + sum(_operators(part) for part in shape[1:])


def _fits(pattern, shape, loose: bool) -> bool:
    """Whether ``shape`` is ``pattern`` with each wildcard of the pattern filled in: by a name
    or a number, or, when ``loose``, by any subexpression."""
    if pattern is None:
        return loose or shape is None or shape[0] == "const"
    if shape is None or len(pattern) != len(shape) or pattern[0] != shape[0]:
        return False
    if pattern[0] == "const":
        return pattern[1] == shape[1]
    return all(_fits(p, s, loose) for p, s in zip(pattern[1:], shape[1:], strict=True))


def _subshapes(shape):
    if shape is None:
        return
    yield shape
    if shape[0] not in ("const", "other"):
        for part in shape[1:]:
            yield from _subshapes(part)


def answer_shapes(region: str) -> list[tuple[object, bool]]:
    """(shape, loose) for the region's expressions. The whole value of a statement (what it
    assigns, returns or tests) is loose, with each local name assigned before it replaced by
    its value, so that `b = x / y; return max(f, b)` is `max(f, x / y)` too: a formula that
    names `b` for `x / y` restates it. Its parts match name for name only, or a formula as
    common as `a * b + c` would find itself in any sum of products."""
    tree = ast.parse(textwrap.dedent(region))
    values: dict[str, ast.AST] = {}

    class Inline(ast.NodeTransformer):
        def visit_Name(self, node):  # noqa: N802 - ast's visitor protocol
            return values.get(node.id, node)

    found: list[tuple[object, bool]] = []
    statements = sorted(
        (n for n in ast.walk(tree) if isinstance(n, ast.stmt)), key=lambda n: n.lineno
    )
    for statement in statements:
        whole = getattr(statement, "value", None) or getattr(statement, "test", None)
        if isinstance(whole, ast.expr):
            found.append((_shape(Inline().visit(copy.deepcopy(whole))), True))
            found += [(part, False) for part in _subshapes(_shape(whole))]
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
            target = statement.targets[0]
            if isinstance(target, ast.Name):
                values[target.id] = Inline().visit(copy.deepcopy(statement.value))
    return found


def prose_formulas(notebook: dict) -> list[tuple[int, str]]:
    """(cell, formula) for each math span, code span and code comment the learner reads."""
    found = []
    for index, cell in enumerate(notebook["cells"]):
        source = _source(cell)
        if cell["cell_type"] == "markdown":
            for math in re.findall(r"\$\$(.+?)\$\$|\$(.+?)\$", source, flags=re.S):
                found.append((index, latex_to_python("".join(math))))
            found += [(index, span) for span in re.findall(r"`([^`\n]+)`", source)]
        elif cell["cell_type"] == "code":
            readline = io.StringIO(source).readline
            for token in tokenize.generate_tokens(readline):
                if token.type == tokenize.COMMENT:
                    comment = token.string.lstrip("#").strip()
                    found += [(index, comment), *((index, p) for p in comment.split(": ")[1:])]
    return found


def _formula_shapes(formula: str) -> list:
    text = formula.split("=")[-1] if re.search(r"(?<![<>=!])=(?!=)", formula) else formula
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError:
        return []
    return [s for s in _subshapes(_shape(tree.body)) if _operators(s) >= FORMULA_OPERATORS]


def restated_answers(notebook: dict, lesson: str) -> list[str]:
    """Each formula of this exercise notebook's prose that has the shape of one of its own
    answers' expressions."""
    regions = [a for a in ANSWERS if a.lesson == lesson and a.kind == "code"]
    leaks = []
    for index, formula in prose_formulas(notebook):
        for pattern in _formula_shapes(formula):
            for answer in regions:
                shapes = answer_shapes(answer.text)
                if any(_fits(pattern, shape, loose) for shape, loose in shapes):
                    leaks.append(f"cell {index}: {formula!r} is the answer of {answer.where}")
                    break
    return sorted(set(leaks))


def test_the_formula_finder_sees_a_formula_in_other_words():
    """The rule below checks something: prose that writes an answer in its own notation, as a
    LaTeX formula, a code span or a comment, is found; words about it are not."""
    answer = "b = groups * (8 * n + 4 * m)\nreturn max(floor_us, b / (gbps * 1e3))"
    region = Answer("99", "demo, cell 3", "f", answer, "code")
    assert latex_to_python(r"\text{bytes} = G\,(8N + 4M)") == "bytes = G * ( 8 * N + 4 * M )"
    for said, leaked in [
        (r"It moves $$\text{bytes} = G\,(8N + 4M)$$", True),
        (r"It costs $\max(t_\text{floor}, \text{bytes} / \text{bandwidth})$", True),
        (r"It moves `g * (8 * n + 4 * m)` bytes", True),
        (r"It moves 8 bytes a token and 4 an entry: $8N$ and $4M$", False),
        (r"It costs the larger of the floor and the time the bytes take", False),
    ]:
        cells = [{"cell_type": "markdown", "source": said}]
        ANSWERS.append(region)
        try:
            found = restated_answers({"cells": cells}, "99")
        finally:
            ANSWERS.remove(region)
        assert bool(found) == leaked, (said, found)


# Formulas that exercises 02 and 09 state, each with why it is context the exercise builds on
# and not its answer; the test holds them to exactly these.
STATED_ELSEWHERE = {
    "02": {
        "cell 1: 'tl.program_id(0) == tl.num_programs(0) - 1' is the answer of "
        "02_first_kernel.ipynb, cell 2": "the grid's contract (num_reqs + 1 programs, the last "
        "one pads) that the check launches; the padding loop is the work",
        "cell 3: 'slot = block_table[q, pos // block_size] * block_size + pos % block_size' "
        "is the answer of 02_first_kernel.ipynb, cell 2": "lesson 01's answer (01.slot_of); "
        "exercise 02 is the kernel around it",
    },
    "09": {
        "cell 3: 'block_tables_ptr + g * block_tables_group_stride + q * block_table_stride' "
        "is the answer of 09_capstone.ipynb, cell 8": "the spec's layout of the stacked block "
        "tables (what the two strides mean); the capstone is the slot logic and the window",
        "cell 3: 'slot_mappings_ptr + g * slot_mappings_stride' is the answer of "
        "09_capstone.ipynb, cell 8": "the spec's layout of the output rows (rows need not be "
        "max_num_tokens apart)",
    },
}


@pytest.mark.parametrize("solution", solution_notebooks(ROOT / "solutions"), ids=lambda p: p.stem)
def test_no_exercise_restates_its_answer(solution):
    """What an exercise notebook shows (its markdown and the comments of its stubs) never
    writes one of its answers, in any notation: the learner works the formula out."""
    lesson = solution.name[:2]
    found = restated_answers(exercise_notebook(solution), lesson)
    assert found == sorted(STATED_ELSEWHERE.get(lesson, {}))


# ---------------------------------------------------------------------------------------------
# Hints: what a check shows after a failure points to the reasoning, never to the answer
# ---------------------------------------------------------------------------------------------
EXERCISE_MODULES = sorted((ROOT / "slotmap" / "exercises").glob("lesson[0-9][0-9].py"))


def _hint_text(node: ast.AST, constants: dict[str, object]) -> str | None:
    """A hint's text as the learner reads it: an f-string's fields stand as ``x`` (a number or
    a name of the case), a module constant by its value; None where it cannot be known."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = [value.value if isinstance(value, ast.Constant) else "x" for value in node.values]
        return "".join(parts)
    if isinstance(node, ast.Name) and isinstance(constants.get(node.id), str):
        return constants[node.id]
    # A translated message, _("...") or N_("..."), reads as its English; .format's fields as x.
    if isinstance(node, ast.Call) and ast.unparse(node.func) in ("_", "N_", "tr") and node.args:
        return _hint_text(node.args[0], constants)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        if node.func.attr == "format":
            text = _hint_text(node.func.value, constants)
            return None if text is None else re.sub(r"\{[^{}]*\}", "x", text)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _hint_text(node.left, constants), _hint_text(node.right, constants)
        return None if left is None or right is None else left + right
    return None


def exercise_hints(path: Path) -> list[str]:
    """Every hint an exercise module can show: each ``Exercise(hint=...)``, and each
    ``Wrong(...)``'s hint (its keyword or fourth argument)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    constants = {
        target.id: text
        for node in tree.body
        if isinstance(node, ast.Assign) and (text := _hint_text(node.value, {})) is not None
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or ast.unparse(node.func) not in ("Wrong", "Exercise"):
            continue
        hints = [k.value for k in node.keywords if k.arg == "hint"]
        if ast.unparse(node.func) == "Wrong" and len(node.args) >= 4:
            hints.append(node.args[3])
        found += [text for hint in hints if (text := _hint_text(hint, constants))]
    return found


def hint_formulas(hint: str) -> list[str]:
    """The runs of the hint's words that are Python expressions, as a learner would type them
    (``cdiv(tile, block_size) + 1`` inside a sentence)."""
    words = hint.replace("`", " ").split()
    found = []
    for start in range(len(words)):
        for end in range(start + 1, min(len(words), start + 16) + 1):
            text = " ".join(words[start:end]).rstrip(".,;:")
            try:
                with warnings.catch_warnings():  # prose is full of invalid escapes
                    warnings.simplefilter("ignore", SyntaxWarning)
                    ast.parse(text, mode="eval")
            except SyntaxError:
                continue
            found.append(text)
    return found


def hints_that_give_answers(lesson: str, hints: list[str]) -> list[str]:
    """The hints of this lesson's exercises that hold a formula of one of its answers' shape."""
    regions = [a for a in ANSWERS if a.lesson == lesson and a.kind == "code"]
    shapes = [shape for answer in regions for shape in answer_shapes(answer.text)]
    return sorted(
        {
            hint
            for hint in hints
            for formula in hint_formulas(hint)
            for pattern in _formula_shapes(formula)
            if any(_fits(pattern, shape, loose) for shape, loose in shapes)
        }
    )


def test_the_hint_finder_sees_a_formula_inside_a_sentence():
    hint = "Use the smallest power of two that holds cdiv(tile, block_size) + 1 entries."
    assert "cdiv(tile, block_size) + 1" in hint_formulas(hint)
    assert hints_that_give_answers("03", [hint]) == [hint]
    assert hints_that_give_answers("03", ["Count the blocks a tile touches at worst."]) == []
    source = 'Wrong("w", hint=f"cdiv({t}, {b}) + 1 blocks")'
    hint_node = ast.parse(source).body[0].value.keywords[0].value
    assert _hint_text(hint_node, {}) == "cdiv(x, x) + 1 blocks"


# Hints that hold a formula of their exercise's answer, by how they start: each is context the
# exercise states elsewhere (kept, with why); every other hint points to the reasoning only.
HINTS_STATED_ELSEWHERE = {
    "09": {
        # The spec of the exercise states the output rows' layout (STATED_ELSEWHERE).
        "Program (g, q): row g of the output starts at slot_mappings_ptr": "the spec's layout",
        "Mask every store, and start row g at slot_mappings_ptr": "the spec's row layout",
        "Row g starts at slot_mappings_ptr + g * slot_mappings_stride": "the spec's row layout",
        "Row g starts at slot_mappings_ptr + group_idx": "the spec's row layout",
    },
}


@pytest.mark.parametrize("module", EXERCISE_MODULES, ids=lambda p: p.stem)
def test_no_hint_shown_after_a_failure_gives_the_answer(module):
    """A failed check's hint says where to look (what a tile spans, where it can start, why a
    power of two), never the expression the exercise asks for."""
    lesson = module.stem.removeprefix("lesson")
    found = hints_that_give_answers(lesson, exercise_hints(module))
    allowed = HINTS_STATED_ELSEWHERE.get(lesson, {})
    assert [h for h in found if not h.startswith(tuple(allowed))] == []
    assert [a for a in allowed if not any(h.startswith(a) for h in found)] == []  # reworded
