"""docs/glossary.md: the course's terms in Chinese, and the check that every translation uses
them (slotmap.translate.glossary)."""

from __future__ import annotations

import pytest

from slotmap.translate.glossary import GLOSSARY, Term, glossary_problems, missing_terms, terms


def test_the_glossary_gives_every_term_its_chinese_and_a_reason():
    found = {term.english: term.chinese for term in terms()}
    # The words vllm-ascend's engineers use, from the article the course grew from.
    assert found["slot"] == ("槽位",)
    assert found["block table"] == ("块表",)
    assert found["context parallel"] == ("上下文并行",)
    assert found["physical block"] == ("物理块",)
    assert found["block offset"] == ("块内偏移",)
    assert found["kv cache"] == ("KV 缓存",)
    assert found["kernel"] == ("算子", "内核")  # a Triton kernel, a Jupyter kernel
    assert found["tile"] == ("tile",) and found["triton"] == ("Triton",)  # kept in English
    assert len(found) >= 60


def test_a_glossary_row_without_a_reason_is_refused(tmp_path):
    path = tmp_path / "glossary.md"
    path.write_text(
        "## Terms\n\n| English | 中文 | why |\n| --- | --- | --- |\n| slot | 槽位 | |\n"
    )
    with pytest.raises(ValueError, match="needs English, 中文 and a reason"):
        terms(path)


GLOSSARY_TERMS = terms(GLOSSARY)


@pytest.mark.parametrize(
    ("english", "chinese", "lacking"),
    [
        ("The block table maps logical blocks.", "页表把逻辑块映射到物理块。", ["block table"]),
        ("Each slot holds one token.", "每个位置存一个 token。", ["slot"]),
        ("The kernel launches one program per request.", "每条请求启动一个 program。", ["kernel"]),
        ("Block tables, plural.", "块表（复数）。", []),
        ("Restart the kernel.", "重启内核。", []),
        ("The kernel writes slot ids.", "该算子写出槽位号。", []),
        # Code, math and link targets are not prose: `block_table` asks for nothing.
        ("Pass `block_table` and $p$ ([x](slot.md)).", "传入 `block_table` 与 $p$。", []),
        ("A triton-ascend build.", "triton-ascend 的构建。", []),
    ],
)
def test_a_translation_that_leaves_out_a_glossary_term_is_named(english, chinese, lacking):
    assert [t.english for t in missing_terms(english, chinese, GLOSSARY_TERMS)] == lacking


def test_the_problem_line_says_where_and_what():
    glossary = [Term("block table", ("块表",))]
    assert glossary_problems([("lesson 01, cell a", "The block table.", "页表。")], glossary) == [
        "lesson 01, cell a: the English says 'block table', the translation lacks 「块表」"
    ]


def test_every_translation_in_the_repository_uses_the_glossary():
    pytest.importorskip("babel")
    from slotmap.translate import messages, notebooks

    texts = notebooks.translated_texts()
    catalog = messages.read()
    texts += [
        (f"slotmap.po {m.id!r}", m.id, m.string)
        for m in catalog
        if m.id and isinstance(m.id, str) and m.string and not m.fuzzy
    ]
    assert texts, "the runtime catalog has translations"
    assert glossary_problems(texts) == []
