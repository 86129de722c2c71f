"""The Ascend compiler tests run apart from the main suite, in ``.venv-ascend`` (``make
ascend-ir``): triton-ascend installs the ``triton`` package over upstream triton, so the two
never share an environment. ``make test`` runs them as a second pytest run with
``--confcutdir=tests/ascend`` (the main suite's conftest needs the course's environment).
Anywhere without triton-ascend, these files are not collected.
"""

from __future__ import annotations

import importlib.metadata
import os

try:
    importlib.metadata.version("triton-ascend")
    collect_ignore_glob: list[str] = []
    os.environ.setdefault("SLOTMAP_BACKEND", "ascend-ir")  # before slotmap is imported
except importlib.metadata.PackageNotFoundError:
    collect_ignore_glob = ["test_*.py"]
