"""The project's own docs hold: no tracked file points at notes outside the repository, every
``docs/<page>.md §N`` citation names a page and a section that exist, every relative link in
a markdown file and every ``benchmarks/results/...`` path resolves, and the worked examples of
docs/semantics.md are what the reference and the kernels compute."""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

import pytest
import torch

import slotmap

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
# Design notes that live outside the repository; spelled in pieces so this file names none.
OUTSIDE = tuple(name + ".md" for name in ("SPEC", "PERF", "STYLE", "COURSE")) + ("SPEC" + " §",)
CITATION = re.compile(r"docs/([\w-]+\.md) §(\d+)")
MARKDOWN_LINK = re.compile(r"\]\(([^)\s]+)\)")
# A path ends at a space, a quote, a bracket or the full-width punctuation of Chinese prose.
RESULTS_PATH = re.compile(r"benchmarks/results/[^\s`'\")\]）。，：；]*")


@cache
def tracked_texts() -> dict[str, str]:
    """Every tracked text file of the checkout, by its path from the root."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    texts = {}
    for name in listed.decode().split("\0"):
        path = ROOT / name
        if not name or not path.is_file():
            continue  # deleted in the working tree
        data = path.read_bytes()
        if b"\0" not in data:
            texts[name] = data.decode("utf-8", errors="replace")
    return texts


def sections(page: Path) -> set[str]:
    """The section numbers of a docs page: its headings ``## §N Title``."""
    return set(re.findall(r"^## §(\d+) ", page.read_text(encoding="utf-8"), re.MULTILINE))


def test_no_tracked_file_names_notes_outside_the_repository() -> None:
    found = [
        f"{name}: {needle}"
        for name, text in tracked_texts().items()
        for needle in OUTSIDE
        if needle in text
    ]
    assert not found, "cite docs/semantics.md or docs/performance.md instead:\n" + "\n".join(found)


def test_the_semantics_page_has_the_five_sections_the_tree_cites() -> None:
    assert sections(DOCS / "semantics.md") == {"1", "2", "3", "4", "5"}


def test_every_docs_citation_names_a_page_and_a_section_that_exist() -> None:
    bad = []
    for name, text in tracked_texts().items():
        for page, section in CITATION.findall(text):
            if not (DOCS / page).is_file():
                bad.append(f"{name}: docs/{page} does not exist")
            elif section not in sections(DOCS / page):
                bad.append(f"{name}: docs/{page} has no §{section}")
    assert not bad, "\n".join(sorted(set(bad)))


def test_every_relative_link_of_a_markdown_file_resolves() -> None:
    bad = []
    for name, text in tracked_texts().items():
        if not name.endswith(".md"):
            continue
        for target in MARKDOWN_LINK.findall(text):
            if re.match(r"[a-z]+:", target) or target.startswith("#") or target == "...":
                continue  # a web address, an anchor in the same page, ``kernel[grid](...)``
            if not (ROOT / name).parent.joinpath(target.split("#")[0]).exists():
                bad.append(f"{name}: {target}")
    assert not bad, "\n".join(bad)


def test_every_results_path_named_in_the_tree_exists() -> None:
    bad = []
    for name, text in tracked_texts().items():
        for path in RESULTS_PATH.findall(text):
            path = path.rstrip(".,:;")
            if not any(c in path for c in "{*<[") and not (ROOT / path).exists():
                bad.append(f"{name}: {path}")  # a pattern of names is not checked
    assert not bad, "moved or deleted results:\n" + "\n".join(sorted(set(bad)))


# ---------------------------------------------------------------------------------------------
# docs/semantics.md's worked examples: the page prints these outputs; the reference and every
# single-group launcher must give them.
# ---------------------------------------------------------------------------------------------
def t(values: list, dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, device=slotmap.DEVICE)


I32, I64 = torch.int32, torch.int64
PLAIN = dict(query_start_loc=[0, 3, 8], positions=[0, 1, 2, 2, 3, 4, 5, 6], table=[[7, 2], [5, 9]])
EXAMPLES = {
    "plain": (PLAIN, 4, {"max_num_tokens": 10}, [28, 29, 30, 22, 23, 36, 37, 38, -1, -1]),
    "hybrid": (
        dict(query_start_loc=[0, 6], positions=[6, 7, 8, 9, 10, 11], table=[[6, 7, 2, 3]]),
        4,
        {"kv_cache_block_size": 8},
        [30, 31, 8, 9, 10, 11],
    ),
    "circular": (
        dict(query_start_loc=[0, 5], positions=[-2, -1, 0, 1, 5], table=[[3]]),
        4,
        {"circular": True},
        [-1, -1, 12, 13, 13],
    ),
    **{
        f"cp-rank-{rank}": (
            dict(query_start_loc=[0, 12], positions=list(range(12)), table=[[10, 11, 12]]),
            4,
            {"kv_cache_block_size": 4, "cp_world_size": 2, "cp_rank": rank, "cp_interleave": 2},
            expected,
        )
        for rank, expected in (
            (0, [40, 41, -1, -1, 42, 43, -1, -1, 44, 45, -1, -1]),
            (1, [-1, -1, 40, 41, -1, -1, 42, 43, -1, -1, 44, 45]),
        )
    },
}
SINGLE_GROUP = {
    "oracle": slotmap.slot_mapping_oracle,
    "torch": slotmap.slot_mapping_torch,
    "window": slotmap.compute_slot_mapping,
    "direct": slotmap.compute_slot_mapping_direct,
}


def semantics_text() -> str:
    return " ".join((DOCS / "semantics.md").read_text(encoding="utf-8").split())


@pytest.mark.parametrize("impl", list(SINGLE_GROUP))
@pytest.mark.parametrize("example", list(EXAMPLES))
def test_a_worked_example_of_the_semantics_page(example: str, impl: str) -> None:
    batch, block_size, options, expected = EXAMPLES[example]
    assert str(expected) in semantics_text(), f"the page no longer shows {expected}"
    got = SINGLE_GROUP[impl](
        t(batch["query_start_loc"], I32),
        t(batch["positions"], I64),
        t(batch["table"], I32),
        block_size,
        **options,
    )
    assert got.cpu().tolist() == expected


def test_the_hybrid_example_expands_its_table_as_the_page_says() -> None:
    assert "`[3, 1]`" in semantics_text() and "`[6, 7, 2, 3]`" in semantics_text()
    assert slotmap.expand_block_table(t([[3, 1]], I32), 2).cpu().tolist() == [[6, 7, 2, 3]]


def test_the_multi_group_example_of_the_semantics_page() -> None:
    text = semantics_text()
    rows = [[28, 29, 30, 22, 23, 36, 37, 38, -1, -1], [8, 9, 8, 12, 13, 12, 13, 12, -1, -1]]
    assert "group 1: [ 8, 9, 8, 12, 13, 12, 13, 12, -1, -1]" in text
    args = (
        t(PLAIN["query_start_loc"], I32),
        t(PLAIN["positions"], I64),
        [t(PLAIN["table"], I32), t([[4], [6]], I32)],
        [4, 2],
    )
    options = {"circular": [False, True], "max_num_tokens": 10}
    for launch in (slotmap.slot_mappings_oracle, slotmap.compute_slot_mappings):
        assert launch(*args, **options).cpu().tolist() == rows


def test_the_dummy_request_example_of_the_semantics_page() -> None:
    text = semantics_text()
    assert "positions `[1, 100]`, `idx_mapping` `[0, -1]`, table `[[7, 8], [9, 10]]`" in text
    assert "`[29, -1]`, as vLLM's own kernel gives" in text
    args = (t([0, 1, 2], I32), t([1, 100], I64), [t([[7, 8], [9, 10]], I32)], [4])
    for dtype in (I32, I64):
        for launch in (slotmap.slot_mappings_oracle, slotmap.compute_slot_mappings):
            assert launch(*args, idx_mapping=t([0, -1], dtype)).cpu().tolist() == [[29, -1]]


def test_the_replay_example_of_the_semantics_page() -> None:
    assert "`replay_start` `[1, 0]`, `window` 2" in semantics_text()
    qsl, positions = t(PLAIN["query_start_loc"], I32), t(PLAIN["positions"], I64)
    rows = [[28, 29, 30, 22, 23, 36, 37, 38], [1, 2, 3, 4, 5, 6, 7, 8]]
    for launch in (slotmap.replay_padding_oracle, slotmap.pad_replayed_slots):
        padded = launch(t(rows, I32), qsl, positions, t([1, 0], I32), 2, [True, False])
        assert padded.cpu().tolist() == [[28, -1, -1, 22, 23, 36, 37, 38], rows[1]]


def test_the_window_examples_of_the_semantics_page() -> None:
    text = semantics_text()
    assert "16 entries at block 128 and 128 at block 16; a 16 tile at block 4 needs 8" in text
    sizes = [slotmap.window_size(1024, 128), slotmap.window_size(1024, 16)]
    assert sizes + [slotmap.window_size(16, 4)] == [16, 128, 8]
    assert "window bases `[0, 1, 2]`" in text
    bases = slotmap.window_bases_oracle(
        t([0, 10], I32), t(list(range(3, 13)), I64), 4, tile_size=4
    )
    assert bases == [[0, 1, 2]]
