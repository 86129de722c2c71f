"""Every figure the lessons draw, and every widget's first figure and controls, speak the
course's language: in Chinese, no English word is left in a title, label, legend or annotation
(identifiers and the terms the glossary keeps in English aside) and the shipped font has every
glyph; in English, they say what they said before they were translated."""

from __future__ import annotations

import io
import json
import re
import warnings
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")
pytest.importorskip("ipywidgets")

import matplotlib  # noqa: E402

matplotlib.use("Agg")

from english_left import KEPT, english_words  # noqa: E402

import slotmap  # noqa: E402
from slotmap import i18n  # noqa: E402

ENGLISH_TEXTS = Path(__file__).resolve().parent / "data" / "viz_texts_en.json"


def _rank_run():
    from slotmap import cp
    from slotmap.distributed import run_ranks
    from slotmap.viz import cp as cp_viz

    world = min(2, cp.max_ranks())
    batch = cp.CPBatch((13, 1, 6), 2, 4, world, 2, starts=(0, 21, 5), max_num_tokens=23, seed=1)
    return cp_viz.draw_rank_run(
        run_ranks(cp.cp_slot_mapping_rank, world, batch, timeout_s=90), batch
    )


def _perf(name: str):
    """Lesson 08's figures of the committed run (the one a CPU draws; an accelerator's live run
    would make the words of the hardware and its numbers vary)."""
    from slotmap.exercises.lesson08 import committed_results
    from slotmap.viz import perf

    data = committed_results()
    return {
        "variants_huge": lambda: perf.draw_variants("huge", 128, "graph", data),
        "variants_decode": lambda: perf.draw_variants("decode256", 128, "graph", data),
        "eager_vs_graph": lambda: perf.draw_eager_vs_graph("direct", 128, data),
        "prediction": lambda: perf.draw_prediction(data),
        "widget": lambda: perf.perf_widget(data),
    }[name]()


def _builders() -> dict:
    """Every figure and widget the notebooks show, with the notebooks' arguments (and the
    choices a widget offers that change the figure's words)."""
    from slotmap.viz import (
        attention,
        circular,
        cp,
        group_kinds,
        groups,
        hybrid,
        paged,
        tiles,
        window,
    )

    corruptions = ("one token to a free slot", "one token to another request's slot")
    found = {
        "paged": lambda: paged.draw_paged((5, 11, 3), block_size=4),
        "paged_decode": lambda: paged.draw_paged(
            (1, 1, 1), block_size=4, first_positions=(6, 12, 2), seed=3
        ),
        "paged_widget": paged.paged_widget,
        "tiles": lambda: tiles.draw_tiles((5, 11, 3), block_size=4, tile_size=4, padding=6),
        "tiles_programs": lambda: tiles.draw_tiles(
            (5, 11, 3), block_size=4, tile_size=4, padding=6, programs=3
        ),
        "tiles_widget": tiles.tiles_widget,
        "windows": lambda: window.draw_windows(
            tile_size=8, block_size=4, first_position=5, num_tokens=22
        ),
        "window_widget": window.window_widget,
        "window_failure_widget": window.window_failure_widget,
        "ring": lambda: circular.draw_ring(position=13, window=6, block_size=8),
        "ring_start": lambda: circular.draw_ring(position=3, window=6, block_size=8),
        "ring_collide": lambda: circular.draw_ring(position=13, window=10, block_size=8),
        "remainder": lambda: circular.draw_remainder(block_size=4, low=-9, high=6, block_number=3),
        "ring_widget": circular.ring_widget,
        "ownership": lambda: cp.draw_ownership(2, 0, 2, 4, 20),
        "ownership_rejected": lambda: cp.draw_ownership(2, 0, 8, 4, 16),
        "five_steps": lambda: cp.draw_five_steps(
            world_size=2, interleave=2, kv_cache_block_size=4, block_size=4
        ),
        "ownership_widget": cp.ownership_widget,
        "rank_run": _rank_run,
        "hybrid": lambda: hybrid.draw_hybrid(
            lengths=(7, 10), block_size=2, blocks_per_kv_block=3, seed=5
        ),
        "hybrid_widget": hybrid.hybrid_widget,
        "groups": lambda: groups.draw_groups(
            lengths=(6, 3, 1), first_positions=(0, 9, 21), full_block_size=4, ring_size=8
        ),
        "groups_widget": groups.groups_widget,
        "tiling": groups.draw_tiling,
        "replay": lambda: groups.draw_replay(cached_blocks=3, window=5, new_tokens=3),
        "replay_widget": groups.replay_widget,
        "group_kinds": group_kinds.draw_group_kinds,
        "paged_attention": lambda: attention.draw_paged_attention(
            seq_lens=(6, 11, 3), block_size=4
        ),
        "paged_attention_widget": attention.paged_attention_widget,
        "cp_attention": lambda: attention.draw_cp_attention(
            seq_len=13, world_size=2, interleave=2, block_size=4
        ),
        "cp_attention_widget": attention.cp_attention_widget,
    }
    for mode in window.FAILURE_MODES:
        found[f"failure {mode}"] = lambda mode=mode: window.draw_window_failure(
            mode, tile_size=8, block_size=4, first_position=3, num_tokens=24
        )
    for corruption in corruptions:
        found[f"attention {corruption}"] = lambda c=corruption: attention.draw_paged_attention(
            (6, 11, 3), 4, corruption=c
        )
    for name in ("variants_huge", "variants_decode", "eager_vs_graph", "prediction", "widget"):
        found[f"perf {name}"] = lambda name=name: _perf(name)
    return found


def texts(shown) -> list[str]:
    """Every text of a figure (or of a widget: its controls' words and its figure's), drawn
    once so that tick labels exist; the glyph warnings the drawing raised come first, marked."""
    import matplotlib.pyplot as plt

    words = []
    fig = getattr(shown, "figure", shown)
    if hasattr(shown, "controls"):
        for name, control in shown.controls.items():
            words.append(f"widget {name}: {control.description}")
            for option in getattr(control, "options", ()):
                label = option[0] if isinstance(option, tuple) else option
                words.append(f"widget {name} option: {label}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig.savefig(io.BytesIO(), format="png")
    missing = [f"MISSING {w.message}" for w in caught if "missing from" in str(w.message)]
    found = [fig._suptitle] if fig._suptitle is not None else []
    found += fig.texts + [t for legend in fig.legends for t in legend.get_texts()]
    for ax in fig.axes:
        found += [ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label]
        found += ax.texts + ax.get_xticklabels() + ax.get_yticklabels()
        if ax.get_legend() is not None:
            found += ax.get_legend().get_texts()
    plt.close(fig)
    shown = [t.get_text() for t in found if re.search("[^\\W\\d_]", t.get_text())]
    # A rank's process id changes from run to run.
    return missing + words + [re.sub(r"\(pid \d+\)", "(pid N)", text) for text in shown]


def all_texts() -> dict[str, list[str]]:
    return {name: texts(make()) for name, make in _builders().items()}


def _identifiers_of_the_run() -> set[str]:
    """The benchmark's own names a performance figure shows as they are in the notebook's code
    (variants, shapes, modes) and the hardware's name."""
    from slotmap.exercises.lesson08 import committed_results
    from slotmap.viz import perf

    data = committed_results()
    names = set(perf.VARIANT_COLOURS) | set(perf.shapes_of(data)) | set(perf.modes_of(data))
    names |= set(str(data["hardware"].get("gpu") or data["hardware"]["backend"]).split())
    return {part for name in names for part in re.split(r"[^A-Za-z]+", name) if part}


def without_math(text: str) -> str:
    """``text`` without its mathtext (a log axis's 10^k). The launcher's message that a
    failure figure quotes after "ValueError" stays: it is translated too."""
    return re.sub(r"\$[^$]*\$", "", text)


@pytest.fixture
def speaking():
    """Restores the course's language after the test."""
    before = i18n.language()
    yield
    i18n.use(before)


@pytest.mark.skipif(
    not slotmap.BACKEND.interpreted,
    reason="the recorded texts are the CPU interpreter's run: its numbers, its processes",
)
def test_in_english_every_figure_says_what_it_said(speaking):
    i18n.use("en")
    recorded = json.loads(ENGLISH_TEXTS.read_text(encoding="utf-8"))
    shown = all_texts()
    assert shown.keys() == recorded.keys()
    for name, texts_shown in shown.items():
        assert texts_shown == recorded[name], name


def test_in_chinese_every_figure_and_widget_has_every_glyph_and_no_english_left(speaking):
    i18n.use("zh")
    kept = KEPT | _identifiers_of_the_run()
    problems = []
    for name, shown in all_texts().items():
        for text in shown:
            if text.startswith("MISSING"):
                problems.append(f"{name}: {text}")
            else:
                shown = without_math(re.sub(r"^widget \S+( option)?: ", "", text))
                words = english_words(shown, kept)
                if words:
                    problems.append(f"{name}: {words} in {text!r}")
    assert problems == []


def test_the_english_word_check_can_fail():
    assert english_words("KV cache: 8 physical blocks of 4 slots", KEPT) == [
        "cache",
        "physical",
        "blocks",
        "of",
        "slots",
    ]
    kept = "槽位 = block_table[q, p // 4] * 4 + p % 4：3 个请求的 19 个 token，max_num_tokens=19"
    assert english_words(kept + "（slotmap.compute_slot_mapping）", KEPT) == []


if __name__ == "__main__":  # the English snapshot: python tests/test_viz_i18n.py
    import sys

    i18n.use("en")
    ENGLISH_TEXTS.parent.mkdir(exist_ok=True)
    snapshot = json.dumps(all_texts(), ensure_ascii=False, indent=1, sort_keys=True)
    ENGLISH_TEXTS.write_text(snapshot + "\n", encoding="utf-8")
    sys.exit(0)
