"""Run a Jupyter program as ``python -m slotmap.jupyter_main MODULE ARGS...``, the way
``python -m MODULE ARGS...`` would, without importing a parser it never uses.

nbformat validates notebooks with jsonschema, which imports rfc3987-syntax when it is
installed (jupyter-events asks for it) to check the "iri" string format; that import builds
a Lark grammar, about 1 to 2 s of CPU in every process that reads a notebook: the lab's
server, each learner's server on the hub, each grading worker. No schema these programs
load uses that format.
"""

from __future__ import annotations

import runpy
import sys


def leave_unused_parsers_unimported() -> None:
    """Keep jsonschema from importing rfc3987-syntax: an import of a ``None`` module raises
    ImportError, which jsonschema takes as the "iri" format's checker being absent."""
    sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[assignment]


def command(module: str) -> list[str]:
    """The command line that runs ``module`` as ``python -m`` would, through this one."""
    return [sys.executable, "-m", __name__, module]


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit(f"usage: python -m {__spec__.name} MODULE [ARGS...]")
    module = sys.argv.pop(1)
    leave_unused_parsers_unimported()
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
