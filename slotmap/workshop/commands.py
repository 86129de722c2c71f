"""``slotmap workshop ACTION``: the hub's three commands, the collection of the learners' work,
the confirmation and the pre-flight check. Above the package and its modules, which it
dispatches to."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from slotmap.workshop import learner_server, state_folder


def run(args: Any, extra: list[str]) -> int:
    """Run one ``slotmap workshop`` action; returns the exit code."""
    if args.action == "learner-server":
        return learner_server(extra)
    if extra:
        print(f"slotmap workshop: unrecognized arguments: {' '.join(extra)}", file=sys.stderr)
        return 2
    if args.action == "proxy":
        from slotmap.workshop.proxy import run_proxy

        return run_proxy()
    if args.action == "dashboard":
        from slotmap.workshop.dashboard import serve

        return serve()
    if args.action == "confirm":
        from slotmap.workshop.dashboard import confirm

        if not args.room or not args.grades:
            print("slotmap workshop confirm: give --room and --grades", file=sys.stderr)
            return 2
        collected = Path(args.collected) if args.collected else None
        return confirm(Path(args.room), Path(args.grades), collected)
    if args.action == "collect":
        from slotmap.workshop.collect import run as collect

        if not args.into:
            print(
                "slotmap workshop collect: give --into (a folder only root reads)", file=sys.stderr
            )
            return 2
        return collect(args.into, args.state or state_folder())
    from slotmap.workshop.preflight import preflight

    return preflight(args.learners)
