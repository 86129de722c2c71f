"""The link on every page to the same page in the other language: both builds have the same
page names, side by side under the site's root (``en/``, ``zh_CN/``)."""

from __future__ import annotations

LANGS = {"en": ("zh_CN", "中文"), "zh_CN": ("en", "English")}


def add_switch(app, pagename, templatename, context, doctree):  # noqa: ANN001, ARG001
    other, label = LANGS[app.config.language]
    depth = pagename.count("/") + 1  # up from the page's folder to the site's root
    context["other_language_url"] = "../" * depth + f"{other}/{pagename}.html"
    context["other_language_label"] = label
    context["other_language"] = other


def setup(app):  # noqa: ANN001, ANN201
    app.connect("html-page-context", add_switch)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
