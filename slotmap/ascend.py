"""triton-ascend's compiler on every kernel the course launches on an NPU, with no NPU and no
CANN.

Two steps, in two environments, because triton-ascend and upstream triton both install the
``triton`` package:

1. **record** (the course's environment, Triton's CPU interpreter): run the lessons, the
   solutions and the library's own launches under the NPU's launch policy
   (``SLOTMAP_LAUNCH_POLICY=npu``) and record each distinct launch (``slotmap.launch_log``);
   the same library launches under the GPU's policy give the GPU-only variants. The result
   is committed as ``benchmarks/results/ascend-launches.json``.
2. **compile** (``.venv-ascend``, ``SLOTMAP_BACKEND=ascend-ir``): build each recorded
   launch with ``triton.compile`` for an Ascend 910B. That runs Triton's frontend (with
   triton-ascend's own checks), the TTIR passes and the Ascend adapter (TTIR -> linalg with
   HIVM annotations), and stops at the binary stage, which needs CANN's bishengir. A launch
   *passes* when it gets that far; the adapter's IR then says what the NPU would run:
   per-lane loads lowered to loops of scalar loads, contiguous copies, gathers.

``slotmap ascend`` (the CLI) runs step 2 and prints the report that is committed as
``benchmarks/results/ascend-ir.md``; ``slotmap ascend --record`` redoes step 1.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
MANIFEST = RESULTS / "ascend-launches.json"
REPORT = RESULTS / "ascend-ir.md"
SNAPSHOT = RESULTS / "ascend-ir.json"
ASCEND_VENV = ROOT / ".venv-ascend"
ARCH = "Ascend910B3"  # an Atlas A2 part; the adapter's lowering is the same across A2/A3
# The notebooks recorded under each policy (with their widgets swept through their range).
NOTEBOOK_FOLDERS = ("notebooks", "solutions")
PASSES = "passes"
FRONTEND = "refused by the frontend"
ADAPTER = "refused by the adapter"
OTHER = "failed"
STALE = "stale"


# ---------------------------------------------------------------------------------------------
# What the adapter's IR shows
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class IRStats:
    """Counts read off the adapter's output (linalg + HIVM annotations)."""

    scalar_load_loops: int  # the adapter's loops of one scalar load a lane (per-lane loads)
    scalar_loads_in_loops: int  # memref.load ops inside any scf.for
    scalar_stores_in_loops: int  # memref.store ops inside any scf.for
    copies: int  # memref.copy: contiguous (masked) loads moved as one block
    gathers: int  # calls of triton_gather: a select inside a loaded window

    def summary(self) -> str:
        return (
            f"scalar-load loops: {self.scalar_load_loops} (loads in loops: "
            f"{self.scalar_loads_in_loops}), stores in loops: {self.scalar_stores_in_loops}, "
            f"copies: {self.copies}, gathers: {self.gathers}"
        )


_LOOP = re.compile(r"\bscf\.for\b")


def ir_stats(ir: str) -> IRStats:
    """Walk the IR's regions: an ``scf.for`` opens one, and every op until its closing brace
    is inside it. The adapter tags the loops it makes out of a per-lane (discrete) access
    ``{ExtractedLoadOrStore}``: those that load are the per-lane loads."""
    depth = 0
    open_loops: list[list] = []  # [brace depth where the loop's region starts, loads in it]
    loads_in = stores_in = per_lane_loops = 0
    for line in ir.splitlines():
        code = line.split("//", 1)[0]
        if open_loops:
            if "memref.load" in code:
                loads_in += 1
                open_loops[-1][1] += 1
            if "memref.store" in code:
                stores_in += 1
        if _LOOP.search(code):
            open_loops.append([depth, 0])
        depth += code.count("{") - code.count("}")
        while open_loops and depth <= open_loops[-1][0]:
            _, loads = open_loops.pop()
            if loads and "ExtractedLoadOrStore" in code:
                per_lane_loops += 1
    return IRStats(
        scalar_load_loops=per_lane_loops,
        scalar_loads_in_loops=loads_in,
        scalar_stores_in_loops=stores_in,
        copies=len(re.findall(r"\bmemref\.copy\b", ir)),
        gathers=len(re.findall(r"call @triton_gather\w*\(", ir)),
    )


def excerpt(ir: str, pattern: str, context: int = 4, limit: int = 14) -> str:
    """A few lines of ``ir`` around the first line that matches ``pattern``, for a lesson."""
    lines = ir.splitlines()
    for i, line in enumerate(lines):
        if re.search(pattern, line):
            part = lines[max(i - context, 0) : i + limit - context]
            return "\n".join(_shorten(p) for p in part)
    return ""


def _shorten(line: str, width: int = 110) -> str:
    return line if len(line) <= width else line[: width - 3] + "..."


# ---------------------------------------------------------------------------------------------
# Step 2: compile (in .venv-ascend, under SLOTMAP_BACKEND=ascend-ir)
# ---------------------------------------------------------------------------------------------
@dataclass
class Compiled:
    launch: dict  # kernel, signature, constants (slotmap.launch_log.describe_launch)
    status: str  # PASSES, FRONTEND, ADAPTER, OTHER or STALE
    first_error: str  # the compiler's first line that says what is wrong ("" when it passes)
    ir: str = ""  # the adapter's output, when the compile got that far
    seconds: float = 0.0
    stats: IRStats | None = field(default=None)

    @property
    def kernel_name(self) -> str:
        return self.launch["kernel"].rsplit(":", 1)[1]


def _first_error(text: str) -> str:
    """The line of a compiler error that names the problem. A frontend error raised inside a
    helper nests the helper's source in its message: take the innermost error, and say in
    which function it was."""
    errors = re.findall(r"(\w+(?:Error|Exception))\(\\*['\"]([^'\"\\]+)", text)
    errors = [e for e in errors if not e[1].startswith("def ")]
    if errors:
        kind, message = errors[-1]
        inside = re.findall(r"def (\w+)\(", text)
        where = f"in {inside[-1]}: " if inside else ""
        return _shorten(f"{where}{kind}: {message}", 160)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in lines:
        if re.search(r"error:|encounters error|Expected|\bnot supported\b", line):
            return _shorten(line, 160)
    return _shorten(lines[-1], 160) if lines else ""


def _cache_dir_of(message: str) -> Path | None:
    found = re.search(r"compiled kernel cache is in (\S+)", message)
    return Path(found.group(1)) if found else None


def compile_launch(launch: dict, cache_dir: Path) -> Compiled:
    """Compile one recorded launch for an Ascend 910B with triton-ascend, up to the binary
    stage (which needs CANN), and classify the outcome."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler.errors import CompilationError

    from slotmap.backend import BACKEND, COMPILE_ONLY

    if BACKEND.name != COMPILE_ONLY:
        raise RuntimeError(f"compile with SLOTMAP_BACKEND={COMPILE_ONLY}, not {BACKEND.name}")
    module, name = launch["kernel"].split(":")
    kernel = getattr(importlib.import_module(module), name)
    constants = {k: v for k, v in launch["constants"].items()}
    os.environ["TRITON_CACHE_DIR"] = str(cache_dir)
    if set(kernel.arg_names) != set(launch["signature"]):
        stale = "the kernel's parameters changed since this launch was recorded"
        return Compiled(launch, STALE, f"{stale}: run `slotmap ascend --record`")
    # Triton 3.2 reads the signature in parameter order; the manifest's keys are sorted.
    signature = {arg: launch["signature"][arg] for arg in kernel.arg_names}
    source = ASTSource(kernel, signature, constants)
    started = time.perf_counter()
    try:
        triton.compile(source, target=GPUTarget("npu", ARCH, 0))
        status, message = PASSES, ""  # a CANN install would have built the binary too
    except CompilationError as error:
        status, message = FRONTEND, str(error)
    except Exception as error:  # noqa: BLE001 - the adapter's failures come as several types
        message = str(error)
        if "ConvertLinalgRToBinary" in message or "ASCEND_HOME_PATH" in message:
            status = PASSES  # the frontend and the adapter are done; the binary needs CANN
        elif "ConvertTritonIRToLinalgIR" in message or "triton-adapter-opt" in message:
            status = ADAPTER
        else:
            status = OTHER
    seconds = time.perf_counter() - started
    ir = ""
    folder = _cache_dir_of(message)
    if folder is not None and (folder / f"{name}.ttadapter").exists():
        ir = (folder / f"{name}.ttadapter").read_text()
    first = "" if status == PASSES else _first_error(message)
    return Compiled(launch, status, first, ir, seconds, ir_stats(ir) if ir else None)


def compile_all(launches: list[dict], log=None) -> list[Compiled]:
    """Compile each launch in a fresh Triton cache, so that every stage runs."""
    results = []
    with tempfile.TemporaryDirectory(prefix="slotmap-ascend-") as tmp:
        for i, launch in enumerate(launches):
            result = compile_launch(launch, Path(tmp) / str(i))
            results.append(result)
            if log:
                log(f"  {result.status:<24} {result.seconds:5.1f} s  {describe(launch)}")
    return results


# ---------------------------------------------------------------------------------------------
# The manifest and the report
# ---------------------------------------------------------------------------------------------
# Constants shown in a configuration's one-line description, in this order (the rest are
# production's defaults in almost every launch and stay in the manifest).
_SHOWN = (
    "TILE_BLOCK_SIZE",
    "BLOCK_TABLE_WINDOW_SIZE",
    "GATHER_AS_FLOAT",
    "LANE_LOADS",
    "parallel_tiles",
    "TOTAL_CP_WORLD_SIZE",
    "TOTAL_CP_RANK",
    "CP_KV_CACHE_INTERLEAVE_SIZE",
    "BLOCKS_PER_KV_BLOCK",
    "IS_CIRCULAR",
    "HAS_IDX_MAPPING",
    "EARLY_ENDS",
    "REQ_LANES",
    "TRACE_WINDOWS",
    "PAD_ID",
)


def describe(launch: dict) -> str:
    """``kernel`` and the constants that tell its configurations apart, on one line."""
    name = launch["kernel"].rsplit(":", 1)[1]
    constants = {**launch["constants"], **launch.get("values", {})}
    shown = [f"{k}={constants[k]}" for k in _SHOWN if k in constants]
    others = sorted(k for k, v in constants.items() if k not in _SHOWN and v is not None)
    shown += [f"{k}={constants[k]}" for k in others]
    return f"{name}({', '.join(shown)})"


def load_manifest(path: Path = MANIFEST) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def launches_of(manifest: dict, policy: str | None = None) -> list[dict]:
    """The manifest's launches, each with its ``policy``; only one policy's when given."""
    found = []
    for name, launches in manifest["policies"].items():
        if policy is None or name == policy:
            found += [{**launch, "policy": name} for launch in launches]
    return found


def _ir_ranges(results: list[Compiled]) -> str:
    """The IR counts over several configurations, as ranges ("0 scalar-load loops, 2 copies")."""
    stats = [r.stats for r in results if r.stats]
    ranges = []
    for label, attr in (
        ("scalar-load loops", "scalar_load_loops"),
        ("copies", "copies"),
        ("gathers", "gathers"),
    ):
        values = sorted({getattr(s, attr) for s in stats})
        if values:
            span = f"{values[0]}" if len(values) == 1 else f"{values[0]}-{values[-1]}"
            ranges.append(f"{label}: {span}")
    return ", ".join(ranges)


def gpu_only_traits(launch: dict) -> str:
    """What makes a launch one the NPU's policy never chooses."""
    constants = {**launch["constants"], **launch.get("values", {})}
    traits = []
    if "tokens" in launch["kernel"]:
        traits.append("token grid (tl.histogram, a block-table load a lane)")
    if constants.get("LANE_LOADS"):
        traits.append("lane loads")
    if constants.get("GATHER_AS_FLOAT") is False and "tokens" not in launch["kernel"]:
        if not constants.get("LANE_LOADS"):
            traits.append("int32 gather")
    if constants.get("parallel_tiles", 1) > 1 and "fused_groups" not in launch["kernel"]:
        traits.append("parallel tiles")  # the fused kernel's are production's (adaptive)
    return ", ".join(traits) or "as on the NPU"


def _result(r: Compiled) -> str:
    return r.status if r.status == PASSES else f"{r.status}: `{r.first_error}`"


def render_report(results: list[Compiled], versions: dict[str, str], manifest: dict) -> str:
    """The markdown report committed as ``benchmarks/results/ascend-ir.md``."""
    npu = [r for r in results if r.launch["policy"] == "npu"]
    gpu = [r for r in results if r.launch["policy"] == "cuda"]
    lines = [
        "# triton-ascend's compiler on slotmap's kernels",
        "",
        f"triton-ascend {versions['triton-ascend']}, target `{ARCH}`, no NPU and no CANN:",
        "each launch goes through Triton's frontend (with triton-ascend's checks), the TTIR",
        "passes and the Ascend adapter (TTIR -> linalg/HIVM), and stops at the binary stage,",
        "which needs CANN's bishengir. **Passes** means it got that far; nothing here has run",
        "on an NPU. Regenerate with `make ascend-ir && .venv/bin/slotmap ascend --write`.",
        "",
        f"Launches recorded ({manifest['recorded_with']}): "
        + ", ".join(f"{len(v)} under the {k} policy" for k, v in manifest["policies"].items())
        + ". Kernels defined in a notebook cell (lesson 00's first kernel, a learner's own)"
        " are not recorded: the compiler needs a function it can import.",
        "",
        "IR counts: *scalar-load loops* are the adapter's loops of one scalar load a lane (a",
        "per-lane global load); *copies* are contiguous loads moved as one block; *gathers*",
        "are selections inside a loaded block (`tl.gather`).",
        "",
        "## Under the NPU's launch policy, per kernel",
        "",
        "| kernel | configurations | pass | IR, over its configurations |",
        "| --- | --- | --- | --- |",
    ]
    for kernel in sorted({r.kernel_name for r in npu}):
        mine = [r for r in npu if r.kernel_name == kernel]
        passed = sum(r.status == PASSES for r in mine)
        lines.append(f"| `{kernel}` | {len(mine)} | {passed} | {_ir_ranges(mine)} |")
    lines += [
        "",
        "## The GPU-only variants (the GPU's launch policy; never chosen on an NPU)",
        "",
        "| kernel | what is GPU-only | configurations | result | IR, over its configurations |",
        "| --- | --- | --- | --- | --- |",
    ]
    groups: dict[tuple, list[Compiled]] = {}
    for r in gpu:
        key = (r.kernel_name, gpu_only_traits(r.launch), r.status, r.first_error)
        groups.setdefault(key, []).append(r)
    for (kernel, traits, _, _), mine in sorted(groups.items()):
        result = _result(mine[0])
        lines.append(f"| `{kernel}` | {traits} | {len(mine)} | {result} | {_ir_ranges(mine)} |")
    lines += [
        "",
        "## Every configuration the NPU's launch policy chose",
        "",
        "| kernel and configuration | result | IR |",
        "| --- | --- | --- |",
    ]
    for r in npu:
        ir = r.stats.summary() if r.stats else ""
        lines.append(f"| `{describe(r.launch)}` | {_result(r)} | {ir} |")
    lines.append("")
    return "\n".join(lines)


# The two kernels lesson 03 compares, under the NPU's policy.
LESSON_KERNELS = ("_compute_slot_mapping_direct_kernel", "_compute_slot_mapping_kernel")


def lesson_launch(kernel: str, manifest: dict | None = None) -> dict:
    """The configuration of ``kernel`` that lesson 03 compiles: production's (1024-token
    tiles, no context parallelism, no ring, no teaching trace, blocks of 16) among the
    launches the NPU's policy recorded."""
    wanted = {
        "TILE_BLOCK_SIZE": 1024,
        "TOTAL_CP_WORLD_SIZE": 1,
        "IS_CIRCULAR": False,
        "BLOCKS_PER_KV_BLOCK": 1,
        "KV_CACHE_BLOCK_SIZE": 16,
    }
    for launch in launches_of(manifest or load_manifest(), "npu"):
        constants = launch["constants"]
        if (
            launch["kernel"].endswith(f":{kernel}")
            and not constants.get("TRACE_WINDOWS")
            and all(constants.get(k) == v for k, v in wanted.items())
        ):
            return launch
    raise LookupError(f"no production configuration of {kernel} was recorded")


def snapshot(results: list[Compiled], int32_gather: Compiled, version: str) -> dict:
    """What lesson 03 shows: the IR's counts and short excerpts of the direct and the window
    kernel in production's configuration (``lesson_launch``), and the int32 gather's refusal.
    Committed as ``benchmarks/results/ascend-ir.json`` for machines without ``.venv-ascend``."""
    picks = {}
    for name in LESSON_KERNELS:
        chosen = lesson_launch(name)
        r = next(r for r in results if r.launch["policy"] == "npu" and same(r.launch, chosen))
        picks[name] = {
            "configuration": describe(r.launch),
            "stats": r.stats.__dict__,
            "scalar_loop": excerpt(r.ir, r"scf\.for .*iter_args", 1, 9),
            # The block table's copy (int32); the positions' copy (int64) comes first.
            "copy": excerpt(r.ir, r"memref\.copy .*xi32", 2, 4),
            "gather": excerpt(r.ir, r"call @triton_gather\w*\(", 2, 4),
        }
    return {
        "triton-ascend": version,
        "arch": ARCH,
        "kernels": picks,
        "int32_gather": {"status": int32_gather.status, "error": int32_gather.first_error},
    }


def same(a: dict, b: dict) -> bool:
    """Two launches of one specialisation (kernel, signature and constants)."""
    return all(a[k] == b[k] for k in ("kernel", "signature", "constants"))


def refused_int32_gather() -> Compiled:
    """The production window kernel with ``GATHER_AS_FLOAT=False``: the int32 gather that
    released triton-ascend refuses (the reason production gathers floats)."""
    window = lesson_launch("_compute_slot_mapping_kernel")
    launch = {**window, "constants": {**window["constants"], "GATHER_AS_FLOAT": False}}
    with tempfile.TemporaryDirectory(prefix="slotmap-ascend-") as tmp:
        return compile_launch(launch, Path(tmp))


def lesson_snapshot() -> dict:
    """Compile just lesson 03's kernels and the int32 gather, here (in ``.venv-ascend``)."""
    import importlib.metadata

    launches = [{**lesson_launch(name), "policy": "npu"} for name in LESSON_KERNELS]
    version = importlib.metadata.version("triton-ascend")
    return snapshot(compile_all(launches), refused_int32_gather(), version)


def lesson_view() -> dict:
    """For lesson 03: compile live when ``.venv-ascend`` exists (``make ascend-ir``), else the
    committed snapshot. ``source`` says which."""
    python = ascend_python()
    if python is not None:
        env = {**os.environ, "SLOTMAP_BACKEND": "ascend-ir", "SLOTMAP_QUIET": "1"}
        env.pop("TRITON_INTERPRET", None)
        done = subprocess.run(
            [str(python), "-m", "slotmap.ascend", "snapshot"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode == 0:
            view = json.loads(done.stdout.strip().splitlines()[-1])
            view["source"] = f"compiled just now by triton-ascend {view['triton-ascend']}"
            return view
    view = json.loads(SNAPSHOT.read_text(encoding="utf-8"))
    view["source"] = (
        f"committed snapshot ({SNAPSHOT.relative_to(ROOT)}), triton-ascend "
        f"{view['triton-ascend']}; run `make ascend-ir` to compile live"
    )
    return view


# ---------------------------------------------------------------------------------------------
# Step 1: record (in the course's environment, on the CPU interpreter)
# ---------------------------------------------------------------------------------------------
# The library's own launches: the doctor's canary and the bench's CPU shapes.
LIBRARY_RUNS = (
    ("slotmap doctor", [sys.executable, "-m", "slotmap", "doctor"]),
    ("slotmap bench", [sys.executable, "-m", "slotmap", "bench", "--quick", "--no-launcher"]),
)


def _policy_env(policy: str, record: Path, source: str) -> dict[str, str]:
    return {
        **os.environ,
        "SLOTMAP_BACKEND": "cpu",
        "SLOTMAP_LAUNCH_POLICY": policy,
        "SLOTMAP_RECORD_LAUNCHES": str(record),
        "SLOTMAP_RECORD_SOURCE": source,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    }


# Appended to each notebook a recording runs: every widget's controls through their range.
SWEEP_CELL = "from slotmap.viz.live import sweep_live_figures\nsweep_live_figures()"


def _execute_notebook(path: Path, env: dict[str, str], timeout: int = 1800) -> list[str]:
    """Run a notebook's code cells, then sweep its widgets, in a fresh IPython process with
    ``env`` (no Jupyter kernel: nothing here needs a frontend, and no client can stall
    waiting for a message); the errors its cells raised."""
    done = subprocess.run(
        [sys.executable, "-m", "slotmap.ascend", "run-notebook", str(path)],
        env={**env, "MPLBACKEND": "Agg"},
        cwd=path.parent,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    errors = [
        line[len("error: ") :] for line in done.stdout.splitlines() if line.startswith("error: ")
    ]
    if done.returncode:
        errors.append(f"exited {done.returncode}: {done.stderr.strip().splitlines()[-1:]}")
    return errors


def run_notebook_cells(path: Path) -> None:
    """``python -m slotmap.ascend run-notebook PATH``: each code cell through IPython, in
    order, then ``SWEEP_CELL``; an ``error: ...`` line for each cell that raised."""
    import nbformat
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    cells = [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
    for number, source in enumerate([*cells, SWEEP_CELL]):
        result = shell.run_cell(source, silent=True)
        if not result.success:
            error = result.error_in_exec or result.error_before_exec
            print(f"error: cell {number}: {type(error).__name__}: {error}", flush=True)


def record_course(log=print, notebooks: bool = True) -> dict:
    """Record every launch of the lessons, the solutions (with every widget swept through its
    range) and the library's own runs, under the NPU's and the GPU's policy; return the
    manifest."""
    policies: dict[str, list[dict]] = {}
    problems: list[str] = []
    from slotmap import launch_log

    with tempfile.TemporaryDirectory(prefix="slotmap-record-") as tmp:
        for policy in ("npu", "cuda"):
            record = Path(tmp) / f"{policy}.jsonl"
            record.touch()
            for source, command in LIBRARY_RUNS:
                log(f"record ({policy}): {source}")
                done = subprocess.run(
                    command,
                    env=_policy_env(policy, record, source),
                    cwd=tmp,
                    capture_output=True,
                    text=True,
                    timeout=1800,
                )
                if done.returncode:
                    problems.append(f"{policy}: {source} exited {done.returncode}")
            if notebooks:
                for folder in NOTEBOOK_FOLDERS:
                    for path in sorted((ROOT / folder).glob("*.ipynb")):
                        source = f"{folder}/{path.name}"
                        log(f"record ({policy}): {source}")
                        errors = _execute_notebook(path, _policy_env(policy, record, source))
                        problems += [f"{policy}: {source}: {e}" for e in errors]
            policies[policy] = [
                {k: v for k, v in launch.items()} for launch in launch_log.read([record])
            ]
    return {
        "recorded_with": "CPU interpreter under each launch policy: "
        + ", ".join(f"{f}/*.ipynb with every widget swept" for f in NOTEBOOK_FOLDERS)
        + ", "
        + ", ".join(name for name, _ in LIBRARY_RUNS),
        "problems": problems,
        "policies": policies,
    }


# ---------------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------------
def ascend_python() -> Path | None:
    """The compile-only environment's python, when ``make ascend-ir`` has built it."""
    python = ASCEND_VENV / "bin" / "python"
    return python if python.exists() else None


def has_triton_ascend() -> bool:
    import importlib.metadata

    try:
        importlib.metadata.version("triton-ascend")
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def run(args: Any) -> int:
    """``slotmap ascend``: compile every recorded launch and print the report (``--write``:
    also write it and the lesson's snapshot); ``--record``: record the launches first."""
    if args.record:
        if has_triton_ascend():
            print("slotmap ascend --record: run it in the course's environment (.venv)")
            return 2
        manifest = record_course()
        MANIFEST.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        counts = {k: len(v) for k, v in manifest["policies"].items()}
        print(f"wrote {MANIFEST.relative_to(ROOT)}: {counts}")
        for problem in manifest["problems"]:
            print(f"  problem: {problem}")
    from slotmap.backend import BACKEND, COMPILE_ONLY

    if has_triton_ascend() and BACKEND.name == COMPILE_ONLY:
        return compile_and_report(write=args.write)
    # The kernels must be decorated for the compiler, in the environment that has it.
    python = sys.executable if has_triton_ascend() else ascend_python()
    if python is None:
        print("slotmap ascend: triton-ascend is not installed here; run `make ascend-ir`")
        return 0 if args.record else 2
    command = [str(python), "-m", "slotmap", "ascend"] + (["--write"] if args.write else [])
    # This process's slotmap may have set TRITON_INTERPRET: the compiler needs it unset.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["SLOTMAP_BACKEND"] = COMPILE_ONLY
    return subprocess.run(command, env=env, check=False).returncode


def compile_and_report(write: bool) -> int:
    """Compile the manifest's launches, print the report (and write it); 1 if a launch the
    NPU's policy chooses was refused."""
    import importlib.metadata

    manifest = load_manifest()
    versions = {"triton-ascend": importlib.metadata.version("triton-ascend")}
    launches = launches_of(manifest)
    print(f"slotmap ascend: compiling {len(launches)} recorded launches for {ARCH}")
    results = compile_all(launches, log=lambda line: print(line, flush=True))
    report = render_report(results, versions, manifest)
    print(report)
    if write:
        REPORT.write_text(report)
        view = snapshot(results, refused_int32_gather(), versions["triton-ascend"])
        SNAPSHOT.write_text(json.dumps(view, indent=1) + "\n")
        print(f"wrote {REPORT.relative_to(ROOT)} and {SNAPSHOT.relative_to(ROOT)}")
    refused = [r for r in results if r.launch["policy"] == "npu" and r.status != PASSES]
    return 1 if refused else 0


if __name__ == "__main__":  # lesson 03's live compile, and the recorder's notebook runs
    if sys.argv[1:] == ["snapshot"]:
        print(json.dumps(lesson_snapshot()))
    elif sys.argv[1:2] == ["run-notebook"] and len(sys.argv) == 3:
        run_notebook_cells(Path(sys.argv[2]))
    else:
        raise SystemExit("usage: python -m slotmap.ascend snapshot | run-notebook PATH")
