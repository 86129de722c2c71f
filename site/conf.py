"""Sphinx configuration of the course site, one language a build (``site/build.py`` runs it
with ``SLOTMAP_SITE_LANG`` set to ``en`` or ``zh_CN`` on a source folder it assembled)."""

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the site's own extension, langswitch
sys.path.insert(0, str(HERE.parent))  # slotmap itself, for the API reference

LANG = os.environ.get("SLOTMAP_SITE_LANG", "en")
ZH = LANG == "zh_CN"

project = "slotmap"
author = "slotmap authors"
copyright = "slotmap authors, Apache-2.0"
language = "zh_CN" if ZH else "en"
html_title = "slotmap：KV 缓存槽位映射课程" if ZH else "slotmap: the KV-cache slot-mapping course"

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    # MathJax from the site's own _static/ (no CDN: the site works offline and builds offline)
    "sphinx-mathjax-offline",
    "langswitch",
    "zh_search",
]
# The notebooks arrive executed (site/build.py keeps its own cache): never run them here.
nb_execution_mode = "off"
# No widget JavaScript from a CDN: every widget is replaced by a static snapshot beforehand.
nb_ipywidgets_js = {}
nb_merge_streams = True
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence"]
myst_heading_anchors = 3
# The exercise checks' record (application/vnd.slotmap.check+json) rides beside their HTML.
suppress_warnings = ["myst.header", "mystnb.unknown_mime_type"]

exclude_patterns = ["_build", "**.ipynb_checkpoints"]
templates_path = [str(HERE / "_templates")]
html_static_path = [str(HERE / "_static")]
html_css_files = ["site.css"]
html_theme = "furo"
html_sidebars = {
    "**": [
        "sidebar/scroll-start.html",
        "sidebar/brand.html",
        "sidebar/lang-switch.html",
        "sidebar/search.html",
        "sidebar/navigation.html",
        "sidebar/scroll-end.html",
    ]
}
# Chinese search segments words with jieba (sphinx.search.zh uses it when it is installed).
html_search_language = "zh" if ZH else "en"
# The pages' sources are executed notebooks: never published beside the pages.
html_copy_source = False
html_show_sourcelink = False
html_last_updated_fmt = None

autodoc_member_order = "bysource"
autodoc_typehints = "description"
