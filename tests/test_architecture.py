"""The code's shape, as the next engineer needs it: imports that point one way, launchers
that show their grid, the configuration written once, taught files that hold taught code,
and every launcher on the cached-plan hot path."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import slotmap
from slotmap.kernels import common, direct, fused_groups, slot_mapping

PACKAGE = Path(slotmap.__file__).parent
# Lower layers first; a module may import only from its own layer or below.
LAYERS = (
    ("slotmap.i18n", "slotmap.backend", "slotmap.layout", "slotmap.launch_log"),
    ("slotmap.validate",),
    ("slotmap.reference",),
    ("slotmap.kernels.common", "slotmap.kernels.c_launch", "slotmap.kernels.launch"),
    ("slotmap.kernels.token_grid", "slotmap.kernels.slot_mapping"),
    ("slotmap.kernels.direct", "slotmap.kernels.fused_groups", "slotmap.kernels.replay"),
    ("slotmap.kernels",),
)


def module_name(path: Path) -> str:
    """``slotmap/kernels/launch.py`` -> ``slotmap.kernels.launch``."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p) for p in PACKAGE.rglob("*.py")}


def imports_of(path: Path) -> set[str]:
    """Every slotmap module ``path`` imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            submodules = {f"{node.module}.{alias.name}" for alias in node.names} & MODULES
            # ``from slotmap import backend`` imports the submodule (the package's __init__
            # is a lazy facade that imports nothing); ``from slotmap import X`` the package.
            found |= submodules or {node.module}
    return {name for name in found if name in MODULES}


GRAPH = {module_name(p): imports_of(p) - {module_name(p)} for p in PACKAGE.rglob("*.py")}


def test_no_import_cycle() -> None:
    # The package's __init__ is the facade learners import: course modules may use it, and it
    # imports the library; every other edge must leave a graph without cycles.
    graph = {m: {n for n in deps if n != "slotmap"} for m, deps in GRAPH.items()}
    state: dict[str, int] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for dep in sorted(graph.get(module, ())):
            if state.get(dep) == 1:
                cycle = path[path.index(dep) :] + [dep] if dep in path else [module, dep]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep, [*path, dep])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


@pytest.mark.parametrize("layer", range(len(LAYERS)))
def test_library_layers_point_down(layer: int) -> None:
    allowed = {m for group in LAYERS[: layer + 1] for m in group}
    for module in LAYERS[layer]:
        upward = GRAPH[module] - allowed
        assert not upward, f"{module} imports {sorted(upward)} from a layer above it"


LAUNCHERS = (
    (slot_mapping, "compute_slot_mapping"),
    (direct, "compute_slot_mapping_direct"),
    (fused_groups, "compute_slot_mappings"),
)


def function_node(module: object, name: str) -> ast.FunctionDef:
    tree = ast.parse(Path(module.__file__).read_text())
    return next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)


@pytest.mark.parametrize(("module", "name"), LAUNCHERS, ids=[n for _, n in LAUNCHERS])
def test_a_launcher_is_short_and_its_grid_is_in_its_own_file(module, name) -> None:
    node = function_node(module, name)
    body_start = node.body[1].lineno  # after the docstring
    assert node.end_lineno - body_start + 1 <= 50, "the launcher's body grew past 50 lines"
    # The grid is spelled out beside the launcher, not behind another module's function.
    assert "grid = " in Path(module.__file__).read_text()
    launched = [
        n
        for n in ast.walk(node)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Subscript)
        and ast.unparse(n.func.slice) == "plan.grid"
    ]
    assert len(launched) == 1, "one kernel[grid](...) call in the launcher's own body"


# The layout's keyword list (docs/semantics.md §1) belongs to SlotLayout and to the public
# functions that mirror production's signatures; no internal function re-spells it.
PUBLIC_SIGNATURES = {
    "compute_slot_mapping",
    "compute_slot_mapping_direct",
    "compute_slot_mappings",
    "slot_mapping_oracle",
    "slot_mapping_torch",
    "slot_mappings_oracle",
    "slot_mappings_torch",
    "window_bases_oracle",
    "token_slot",
    "token_block_and_offset",
    "_check_groups",  # the multi-group references' one call of group_layouts
    "group_layouts",
    "of",
}


def test_the_configuration_keyword_list_is_written_once() -> None:
    library = [
        "layout.py",
        "validate.py",
        "reference.py",
        *(f"kernels/{p.name}" for p in (PACKAGE / "kernels").glob("*.py")),
    ]
    respelled = []
    for name in library:
        for node in ast.walk(ast.parse((PACKAGE / name).read_text())):
            if isinstance(node, ast.FunctionDef) and node.name not in PUBLIC_SIGNATURES:
                params = {a.arg for a in node.args.args + node.args.kwonlyargs}
                if {"cp_world_size", "cp_interleave"} <= params:
                    respelled.append(f"{name}:{node.name}")
    assert respelled == []


def test_the_taught_helpers_file_holds_only_kernel_helpers() -> None:
    tree = ast.parse(Path(common.__file__).read_text())
    functions = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert functions == ["_block_and_offset", "_gather_from_window", "_fill_pad"]
    # Each is a Triton kernel function (compiled or interpreted: both wrap it as ``.fn``),
    # not a host helper.
    assert all(getattr(getattr(common, f), "fn", None).__name__ == f for f in functions)


def _batch():
    device = slotmap.DEVICE
    qsl = torch.tensor([0, 3, 5], dtype=torch.int32, device=device)
    positions = torch.tensor([0, 1, 2, 7, 8], dtype=torch.int64, device=device)
    tables = [torch.tensor([[3, 1, 0], [4, 6, 2]], dtype=torch.int32, device=device)] * 2
    return qsl, positions, tables


@pytest.mark.parametrize("launcher", ["window", "direct", "fused"])
def test_every_launcher_reuses_its_plan_with_validation_off(launcher, monkeypatch) -> None:
    qsl, positions, tables = _batch()
    groups = 2 if launcher == "fused" else 1
    out = torch.full((groups, 8), -7, dtype=torch.int32, device=slotmap.DEVICE)
    if launcher == "fused":
        module = fused_groups

        def call():
            return slotmap.compute_slot_mappings(
                qsl,
                positions,
                tables,
                [4, 4],
                num_tokens=5,
                max_num_tokens=8,
                out=out,
                validate=False,
            )
    else:
        module = slot_mapping if launcher == "window" else direct
        run = getattr(module, LAUNCHERS[["window", "direct"].index(launcher)][1])

        def call():
            return run(
                qsl,
                positions,
                tables[0],
                4,
                num_tokens=5,
                max_num_tokens=8,
                out=out[0],
                validate=False,
            )

    call()
    want = slotmap.slot_mapping_oracle(qsl, positions, tables[0], 4, max_num_tokens=8)

    def no_full_way(*args, **kwargs):
        raise AssertionError("the hot call went the full way (resolve_counts)")

    monkeypatch.setattr(module, "resolve_counts", no_full_way)
    monkeypatch.setattr(torch, "tensor", no_full_way)  # no host-to-device copy either
    out.fill_(-7)
    call()
    for g in range(groups):
        assert out[g].tolist() == want.tolist()
