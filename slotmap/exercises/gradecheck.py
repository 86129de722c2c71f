"""What a restored check cell runs while ``slotmap grade`` executes a notebook.

The grader does not run a submission's check cells as the learner left them: it puts the
solution's check cell back and, at execution time only, replaces its source by a call of
``run`` below, read by path from the grader's read-only snapshot of ``slotmap`` (not from
``sys.modules``, which the learner's earlier cells may have patched). ``run`` imports the
checking code afresh from that snapshot, runs the solution's check source with that ``check``,
and signs each result with a per-notebook secret that appears in no cell before this one. The
grader accepts a result only when it carries a valid signature for the exercise and cell it
ran in (``signature``), found in that cell's own outputs.

This file is executed by path with ``exec``: it imports nothing from ``slotmap`` at the top.
"""

from __future__ import annotations

import sys
from typing import Any

# Modules re-imported from the snapshot for the check and put back afterwards: the checking
# code, its property-testing library, and what computes and serialises the signature.
FRESH = ("slotmap", "hypothesis", "_hypothesis_globals", "hmac", "hashlib", "_hashlib", "json")


def signature(secret: str, record: dict[str, Any], hmac_module: Any = None) -> str:
    """HMAC-SHA256 of a record's exercise, verdict (a skip's reason too) and cell index under
    ``secret``."""
    if hmac_module is None:
        import hmac as hmac_module
    message = f"{record.get('exercise')!s}\n{record.get('passed') is True}\n{record.get('cell')}"
    if "skipped" in record:
        message += f"\nskipped: {record['skipped']!s}"
    return hmac_module.new(secret.encode(), message.encode(), "sha256").hexdigest()


def _fresh_names() -> list[str]:
    return [n for n in list(sys.modules) if n.split(".")[0] in FRESH]


def _fresh_twin(value: Any, stale: dict) -> Any:
    """The freshly imported counterpart of a module, class or function of a stale module (one
    of ``stale``), or None."""
    import importlib
    import types

    name = value.__name__ if isinstance(value, types.ModuleType) else None
    if name is None and isinstance(value, (type, types.FunctionType)):
        name = getattr(value, "__module__", None)
    if name not in stale or stale[name] is None:
        return None
    try:
        twin: Any = importlib.import_module(name)
    except ImportError:
        return None
    if isinstance(value, types.ModuleType):
        return twin
    for part in getattr(value, "__qualname__", "").split("."):
        twin = getattr(twin, part, None)
    return twin


def run(*, snapshot: str, secret: str, cell: int, source: str, namespace: dict) -> None:
    """Run a check cell's ``source`` with a ``check`` imported afresh from ``snapshot``, whose
    results carry a signature; the learner's modules are put back afterwards."""
    import contextlib
    import io

    saved = {name: sys.modules.pop(name) for name in _fresh_names()}
    path = list(sys.path)
    sys.path[:] = [snapshot, *path]
    try:
        import hmac

        with contextlib.redirect_stdout(io.StringIO()):  # the backend banner, printed again
            from slotmap.exercises import core

        rebound: dict[str, Any] = {}

        def check(exercise_id: str, candidate: Any, *, max_examples: int | None = None) -> Any:
            exercise = core.get_exercise(exercise_id)
            # The learner's names for slotmap's classes and modules point at the fresh ones
            # while the check runs: a judge's isinstance(x, SlotCase) holds for their objects.
            for name, value in list(namespace.items()):
                twin = _fresh_twin(value, saved)
                if twin is not None and twin is not value:
                    rebound.setdefault(name, value)
                    namespace[name] = twin
            result = core.run_check(exercise, candidate, max_examples=max_examples)
            record = {"exercise": exercise.id, "passed": result.passed is True, "cell": cell}
            if result.skipped:
                record["skipped"] = str(result.skipped)
            record["signature"] = signature(secret, record, hmac)
            core._show(result, record)
            return result

        try:
            exec(source, dict(namespace, check=check))
        finally:
            namespace.update(rebound)
    finally:
        for name in _fresh_names():
            del sys.modules[name]
        sys.modules.update(saved)
        sys.path[:] = path
