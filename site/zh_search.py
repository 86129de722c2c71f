"""Chinese search on Sphinx 9.0: sphinx.search.zh segments words with jieba and stems the
Latin ones with the English stemmer, but its language_data.js then names a ``ChineseStemmer``
that does not exist, and every search stops with a ReferenceError (sphinx-doc/sphinx#14229,
fixed after 9.0.4, the newest Sphinx for Python 3.11). The same language, with the stemmer's
real name."""

from __future__ import annotations

from sphinx.search.zh import SearchChinese


class SearchChineseNamed(SearchChinese):
    language_name = "English"  # the class the English stemmer's code defines: EnglishStemmer


def setup(app):  # noqa: ANN001, ANN201
    app.add_search_language(SearchChineseNamed)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
