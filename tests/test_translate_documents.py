"""Translated Markdown documents: built from the English ones plus per-block translations, and a
check that names every stale or missing block (slotmap.translate.documents)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("babel")

from slotmap.translate import documents  # noqa: E402
from slotmap.translate.documents import (  # noqa: E402
    blocks,
    build_documents,
    document_problems,
    po_path,
    status,
    update_documents,
)
from slotmap.translate.notebooks import (  # noqa: E402
    carry_over_problems,
    read_catalog,
    translation_problems,
    write_catalog,
)

ENGLISH = """# slotmap

中文：[README.zh-CN.md](README.zh-CN.md)

Each token's slot comes from the block table.

## Two commands

```bash
make lab     # sets everything up and opens the course
make test    # runs the linter and the whole test suite
```

- **First item:** the first run creates `.venv`.
- **Second item:** later runs skip the install
  until `pyproject.toml` changes.

| # | lesson |
| --- | --- |
| 01 | the paged KV cache |

## The library

```python
slot = block_table[q, p // 4] * 4 + p % 4
```

The API, in English only.
"""
ZH = {
    "title": "# slotmap",
    "#1": "每个 token 的槽位由块表决定。",
    "two-commands": "## 两条命令",
    "two-commands#1": "- **第一项：** 第一次运行会创建 `.venv`。",
    "two-commands#2": "- **第二项：** 之后的运行跳过安装，\n  直到 `pyproject.toml` 改变。",
    "two-commands#3": "| # | 课程 |\n| --- | --- |\n| 01 | 分页 KV 缓存 |",
}


def translate(root: Path, keep: str | None = None, **entries: str) -> None:
    path = po_path("README.md", root=root)
    catalog = read_catalog(path)
    for message in catalog:
        if message.context in entries:
            message.string = entries[message.context]
        if message.context == keep:
            message.string = "## 库\n\n（本节是库的 API 参考，保持英文。）"
            message.flags.add(documents.KEEP)
    write_catalog(path, catalog)


def mark_complete(root: Path) -> None:
    (root / "translations" / "zh_CN" / "complete.txt").write_text("README.md\n")


@pytest.fixture
def course(tmp_path: Path) -> Path:
    root = tmp_path / "course"
    root.mkdir()
    (root / "README.md").write_text(ENGLISH)
    update_documents(root=root)
    return root


def done(course: Path) -> Path:
    translate(course, keep="the-library", **ZH)
    mark_complete(course)
    build_documents(root=course)
    return course / "README.zh-CN.md"


def test_a_document_splits_into_blocks_that_put_it_back_together_exactly():
    found = blocks(ENGLISH, "README.zh-CN.md")
    assert [(b.kind, b.key) for b in found] == [
        ("heading", "title"),
        ("link", ""),
        ("paragraph", "#1"),
        ("heading", "two-commands"),
        ("code", ""),
        ("item", "two-commands#1"),
        ("item", "two-commands#2"),
        ("table", "two-commands#3"),
        ("heading", "the-library"),
        ("code", ""),
        ("paragraph", "the-library#1"),
    ]
    lines = ENGLISH.split("\n")
    rebuilt, at = [], 0
    for block in found:
        rebuilt += lines[at : block.start] + block.text.split("\n")
        at = block.end
    assert "\n".join(rebuilt + lines[at:]) == ENGLISH
    for readme in ("README.md", "workshop/README.md"):  # the real ones split the same way
        text = (documents.ROOT / readme).read_text(encoding="utf-8")
        assert all(b.text in text for b in blocks(text))


def test_a_table_right_under_a_comment_is_a_table_to_translate():
    # A comment is one line: the table under it (docs/semantics.md's mapper refusals, made
    # for a test to find) was once taken as part of the comment and left in English.
    text = "\n".join(
        ["<!-- refusals -->", "| case | refused when |", "| --- | --- |", "| `x` | never |"]
        + ["<!-- /refusals -->"]
    )
    assert [b.kind for b in blocks(text)] == ["html", "table", "html"]


def test_update_gives_every_prose_block_an_entry_and_code_none(course):
    catalog = read_catalog(po_path("README.md", root=course))
    assert sorted(m.context for m in catalog if m.id) == sorted(
        [*ZH, "the-library", "the-library#1"]
    )
    assert all("make lab" not in m.id for m in catalog if m.id)
    assert status("README.md", root=course).missing[:2] == ["title", "#1"]
    assert document_problems(root=course) == [] and build_documents(root=course) == []


def test_the_built_document_keeps_code_blocks_byte_identical_and_links_back(course):
    built = done(course)
    assert document_problems(root=course) == []
    chinese = built.read_text()
    for code in [b.text for b in blocks(ENGLISH) if b.kind == "code"]:
        assert code in chinese
    assert "English: [README.md](README.md)" in chinese and "中文：" not in chinese
    assert (
        "- **第二项：** 之后的运行跳过安装，\n  直到 `pyproject.toml` 改变。\n\n| # | 课程 |"
        in (chinese)
    )
    # A section kept in English: its heading translated (saying so), its blocks as they are.
    assert "## 库\n\n（本节是库的 API 参考，保持英文。）\n\n```python" in chinese
    assert chinese.endswith("The API, in English only.\n")
    assert status("README.md", root=course).kept == ["the-library#1"]


def test_a_changed_english_block_makes_its_translation_stale_and_the_check_names_it(course):
    done(course)
    (course / "README.md").write_text(ENGLISH.replace("creates `.venv`", "creates `.venv-2`"))
    problems = document_problems(root=course)
    assert (
        "README.md, block two-commands#1 ('- **First item:** the first run creates `.venv-2`.'):"
        " stale (the English changed)"
    ) in problems
    assert "README.zh-CN.md is built, but its translation is not complete" in problems
    with pytest.raises(ValueError, match="listed complete but not: README.md"):
        build_documents(root=course)
    update_documents(root=course)
    message = {m.context: m for m in read_catalog(po_path("README.md", root=course))}[
        "two-commands#1"
    ]
    assert message.fuzzy and message.string == ZH["two-commands#1"]
    assert status("README.md", root=course).stale == ["two-commands#1"]


def test_a_changed_code_block_needs_no_translation_but_a_rebuild(course):
    built = done(course)
    (course / "README.md").write_text(ENGLISH.replace("make test ", "make check"))
    assert document_problems(root=course) == [
        "README.zh-CN.md differs from what its translation builds"
    ]
    build_documents(root=course)
    assert "make check" in built.read_text() and document_problems(root=course) == []


def test_a_built_document_edited_by_hand_fails_the_check(course):
    built = done(course)
    built.write_text(built.read_text().replace("块表", "页表"))
    assert document_problems(root=course) == [
        "README.zh-CN.md differs from what its translation builds"
    ]


def test_a_paragraph_inserted_above_moves_keys_but_keeps_translations(course):
    done(course)
    (course / "README.md").write_text(
        ENGLISH.replace("## Two commands\n", "## Two commands\n\nA new paragraph.\n")
    )
    assert status("README.md", root=course).missing == ["two-commands#1"]
    assert document_problems(root=course) == [
        "README.md, block two-commands#1 ('A new paragraph.'): missing (listed complete)",
        "README.zh-CN.md is built, but its translation is not complete",
    ]
    update_documents(root=course)
    translate(course, **{"two-commands#1": "新的一段。"})
    build_documents(root=course)
    assert document_problems(root=course) == []


def test_a_new_block_in_a_section_kept_in_english_needs_only_a_rebuild(course):
    done(course)
    (course / "README.md").write_text(ENGLISH + "\nOne more line.\n")
    assert document_problems(root=course) == [
        "README.zh-CN.md differs from what its translation builds"
    ]
    build_documents(root=course)
    assert (course / "README.zh-CN.md").read_text().endswith("One more line.\n")


def test_a_link_to_a_document_built_in_chinese_leads_to_its_translation(tmp_path):
    root = tmp_path / "course"
    (root / "docs").mkdir(parents=True)
    link = "[docs/semantics.md](docs/semantics.md)"
    (root / "README.md").write_text(ENGLISH.replace("block table.", f"block table: {link}."))
    (root / "docs" / "semantics.md").write_text("# Semantics\n\nThe slot is `row[b]`.\n")
    update_documents(root=root)
    translate(root, keep="the-library", **dict(ZH, **{"#1": f"槽位由块表决定：{link}。"}))
    mark_complete(root)
    build_documents(root=root)
    # Not yet translated: the link stays on the English page.
    assert f"槽位由块表决定：{link}。" in (root / "README.zh-CN.md").read_text()

    path = po_path("docs/semantics.md", root=root)
    catalog = read_catalog(path)
    for message in catalog:
        message.string = {"title": "# 语义", "#1": "槽位是 `row[b]`。"}.get(message.context, "")
    write_catalog(path, catalog)
    (root / "translations" / "zh_CN" / "complete.txt").write_text("README.md\ndocs/semantics.md\n")
    assert document_problems(root=root) != []  # the README built before is now stale
    build_documents(root=root)
    zh = "[docs/semantics.zh-CN.md](docs/semantics.zh-CN.md)"
    assert f"槽位由块表决定：{zh}。" in (root / "README.zh-CN.md").read_text()
    assert (root / "docs" / "semantics.zh-CN.md").read_text().startswith("# 语义")
    assert document_problems(root=root) == []


def test_the_notebook_check_ignores_the_documents_in_complete_txt(course):
    done(course)
    assert translation_problems(root=course) == []


def test_the_repository_documents_are_current_and_keep_what_they_must():
    from slotmap.translate.glossary import glossary_problems

    assert document_problems() == []
    texts = documents.translated_texts()
    kept = [p for where, en, zh in texts for p in carry_over_problems(where, en, zh)]
    assert kept == []
    assert glossary_problems(texts) == []
    for document in documents.complete_documents():
        print(document, len(status(document).translated), "blocks translated")


def test_the_operating_system_windows_asks_for_no_window():
    from slotmap.translate.glossary import missing_terms, terms

    glossary = terms()
    assert (
        missing_terms(
            "Use Linux on macOS or Windows.", "在 macOS 或 Windows 上用 Linux。", glossary
        )
        == []
    )
    lacking = missing_terms("Two windows of blocks.", "两个 Windows 的块。", glossary)
    assert [t.english for t in lacking] == ["window"]


def test_a_translation_whose_english_block_is_gone_is_named_and_update_drops_it(course):
    done(course)
    (course / "README.md").write_text(
        ENGLISH.replace("- **First item:** the first run creates `.venv`.\n", "")
    )
    problems = document_problems(root=course)
    assert "README.md, block two-commands#1: translated, but no such English" in problems
    update_documents(root=course)
    assert status("README.md", root=course).translated == [
        "title",
        "#1",
        "two-commands",
        "two-commands#1",
        "two-commands#2",
        "the-library",
    ]
    build_documents(root=course)
    assert document_problems(root=course) == []


def test_complete_txt_may_only_list_documents_that_are_translated(course):
    (course / "translations" / "zh_CN" / "complete.txt").write_text("NOTES.md\n")
    assert document_problems(root=course) == [
        "complete.txt lists NOTES.md, which is not a translated document"
    ]
