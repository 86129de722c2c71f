"""What ``slotmap lab`` adds to the Jupyter server (imports jupyter_server: only the lab uses it).

``CourseContentsManager`` hands JupyterLab each notebook with the kernel metadata that
JupyterLab itself would write into it as soon as its kernel starts (the kernel's display
name, and the ``language_info`` the kernel reports, Python's version included). Without
it, every lesson shows unsaved changes the moment it opens, and closing it asks whether to
save. The files on disk are untouched: the course's notebooks ship with portable metadata,
and the pre-save hook (``slotmap.lab.keep_course_notebooks_clean``) puts it back on a save.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any

from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager


@functools.cache
def _ipykernel_language_info() -> dict[str, Any] | None:
    try:
        from ipykernel.ipkernel import IPythonKernel
    except ImportError:
        return None
    return dict(IPythonKernel.language_info)


def kernel_metadata(kernel_spec_manager: Any, name: str) -> dict[str, Any]:
    """The ``kernelspec`` and ``language_info`` metadata JupyterLab writes for kernel ``name``,
    as far as it can be known before the kernel starts (empty when it cannot)."""
    try:
        spec = kernel_spec_manager.get_kernel_spec(name)
    except Exception:  # noqa: BLE001 - no such kernel: JupyterLab asks the learner
        return {}
    metadata: dict[str, Any] = {
        "kernelspec": {"name": name, "display_name": spec.display_name, "language": spec.language}
    }
    # language_info comes from the kernel; known here only for ipykernel in this interpreter.
    python = spec.argv[0] if spec.argv else ""
    this_python = python in ("python", "python3") or os.path.realpath(python) == os.path.realpath(
        sys.executable
    )
    if this_python and "ipykernel" in " ".join(spec.argv) and _ipykernel_language_info():
        metadata["language_info"] = _ipykernel_language_info()
    return metadata


def fill_kernel_metadata(notebook: dict[str, Any], kernel_spec_manager: Any) -> None:
    """Complete a notebook's kernel metadata in place (see the module docstring)."""
    metadata = notebook.setdefault("metadata", {})
    name = (metadata.get("kernelspec") or {}).get("name")
    if not name:
        return
    for key, value in kernel_metadata(kernel_spec_manager, name).items():
        if key == "language_info" and metadata.get(key, {}).get("name") not in (None, "python"):
            continue
        metadata[key] = value


class CourseContentsManager(AsyncLargeFileManager):
    """Jupyter's default contents manager, handing out notebooks with their kernel metadata
    filled in (``fill_kernel_metadata``)."""

    async def get(self, path, content=True, type=None, format=None, **kwargs):  # noqa: A002
        model = await super().get(path, content=content, type=type, format=format, **kwargs)
        if content and model.get("type") == "notebook" and isinstance(model.get("content"), dict):
            manager = getattr(self.parent, "kernel_spec_manager", None)
            if manager is not None:
                fill_kernel_metadata(model["content"], manager)
        return model
