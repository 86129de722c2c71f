"""Record every Triton launch a process makes: which kernel, with which argument types and
compile-time constants. The record is what a compiler is asked to build, so that a list of
specialisations comes from real runs (the lessons, the solutions, the library's own
launches) rather than from a list kept by hand.

Recording works under Triton's CPU interpreter, where every ``kernel[grid](...)`` goes
through ``InterpretedFunction.run``. Set ``SLOTMAP_RECORD_LAUNCHES=FILE`` before importing
slotmap (child processes inherit it, so the ranks of lessons 05 and 07 record too), or call
``start(FILE)``. Each distinct launch is appended once per process to FILE as one JSON line;
``read(FILE)`` merges them.
"""

from __future__ import annotations

import inspect
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

RECORD_VAR = "SLOTMAP_RECORD_LAUNCHES"
# Keyword arguments of a launch that are not kernel parameters (Triton's launch options).
LAUNCH_OPTIONS = {"num_warps", "num_stages", "num_ctas", "maxnreg", "grid", "warmup"}
# Runtime arguments whose value a launch records too: they shape the work a program does
# (programs per request), where the compiler sees only their type.
RECORDED_VALUES = {"parallel_tiles"}
_TORCH_DTYPES = {
    "int8": "i8",
    "int16": "i16",
    "int32": "i32",
    "int64": "i64",
    "uint8": "u8",
    "float16": "fp16",
    "bfloat16": "bf16",
    "float32": "fp32",
    "float64": "fp64",
    "bool": "i1",
}


def argument_type(value: Any) -> str | None:
    """Triton's signature type of a runtime argument ("*i32", "i32", "fp32"), or None for an
    argument Triton treats as a constant (None)."""
    if value is None:
        return None
    if hasattr(value, "data_ptr") and hasattr(value, "dtype"):
        return "*" + _TORCH_DTYPES[str(value.dtype).removeprefix("torch.")]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"cannot type a kernel argument of {type(value).__name__}")


def describe_launch(fn: Any, args: tuple, kwargs: dict) -> dict:
    """One launch as a compiler sees it: the kernel's import path, each runtime parameter's
    type (``signature``) and each compile-time constant's value (``constants``)."""
    parameters = inspect.signature(fn).parameters
    bound = inspect.signature(fn).bind_partial(
        *args, **{k: v for k, v in kwargs.items() if k not in LAUNCH_OPTIONS}
    )
    bound.apply_defaults()
    signature: dict[str, str] = {}
    constants: dict[str, Any] = {}
    values: dict[str, Any] = {}
    for name, value in bound.arguments.items():
        annotation = str(parameters[name].annotation)
        if "constexpr" in annotation:
            constants[name] = value
            signature[name] = "constexpr"
        elif (kind := argument_type(value)) is None:
            constants[name] = None
            signature[name] = "constexpr"
        else:
            signature[name] = kind
            if name in RECORDED_VALUES:
                values[name] = value
    launch = {
        "kernel": f"{fn.__module__}:{fn.__qualname__}",
        "signature": signature,
        "constants": constants,
    }
    return {**launch, "values": values} if values else launch


def launch_key(launch: dict) -> str:
    """The identity of a specialisation: kernel, signature and constants."""
    fields = [launch["kernel"], launch["signature"], launch["constants"], launch.get("values", {})]
    return json.dumps(fields, sort_keys=True)


_seen: set[str] = set()
_path: Path | None = None
_source = ""


def start(path: str | os.PathLike, source: str = "") -> None:
    """Append each distinct launch this process makes from now on to ``path`` (JSON lines).
    ``source`` says what ran (a notebook's name, say); without it the process's script."""
    from triton.runtime.interpreter import InterpretedFunction

    global _path, _source
    _path = Path(path)
    _source = source or os.environ.get("SLOTMAP_RECORD_SOURCE", "")
    if getattr(InterpretedFunction.run, "_slotmap_records", False):
        return
    original = InterpretedFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        _note(describe_launch(self.fn, args, kwargs))
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    run._slotmap_records = True
    InterpretedFunction.run = run


def _note(launch: dict) -> None:
    key = launch_key(launch)
    if _path is None or key in _seen:
        return
    _seen.add(key)
    line = json.dumps({**launch, "source": _source}, sort_keys=True) + "\n"
    # One write per line in append mode: processes that record into one file do not interleave.
    with open(_path, "a", encoding="utf-8") as handle:
        handle.write(line)


def read(paths: Iterable[str | os.PathLike], prefix: str = "slotmap.") -> list[dict]:
    """The distinct launches recorded in ``paths`` of kernels whose module starts with
    ``prefix``, each with the sorted list of sources that made it, in a stable order."""
    merged: dict[str, dict] = {}
    for path in paths:
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            launch = json.loads(line)
            if not launch["kernel"].startswith(prefix):
                continue
            entry = merged.setdefault(launch_key(launch), {**launch, "sources": []})
            entry.pop("source", None)
            if launch.get("source") and launch["source"] not in entry["sources"]:
                entry["sources"].append(launch["source"])
    for entry in merged.values():
        entry["sources"].sort()
    return [merged[k] for k in sorted(merged)]
