"""The course in a second language, from one source that cannot drift.

English is the source everywhere; a translation is tied to the exact English it translates and
is stale the moment that English changes.

* ``notebooks``: each lesson's and solution's markdown cells, translated in a gettext file per
  notebook (``translations/<lang>/<folder>/<notebook>.po``: msgctxt the cell's id, msgid the
  cell's English, msgstr its translation); the translated notebooks are built from the English
  ones (code cells copied as they are) and never edited by hand.
* ``documents``: README.md, the workshop's guide and the instructor's notes, translated block by
  block (paragraph, heading, list item, table) in ``translations/<lang>/docs/<path>.po``; code
  blocks copied from the English; built as ``README.zh-CN.md`` beside each.
* ``messages``: what the course says at run time, through ``slotmap.i18n._`` and the gettext
  catalog ``slotmap/locale/<lang>/LC_MESSAGES/slotmap.po`` (Babel: extract, update, compile).
* ``glossary``: ``docs/glossary.md``'s terms, and the check that translations use them.

``slotmap translate update|build|messages [--check]`` is the command line of all three.
"""
