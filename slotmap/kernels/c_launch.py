"""Triton's own C launcher, reached directly: the serving mappers' fast path on NVIDIA GPUs.

``kernel[grid](...)`` costs tens of µs of Python a launch on a serving host: it binds the
arguments, works out the specialisation key (each argument's type; whether an integer equals
1 or a pointer or integer is divisible by 16), looks the compiled variant up, and only then
calls the compiled kernel's C launcher. A serving step whose variant is known needs only the
last call. This module is the adapter that makes it:

* ``resolve`` finds the compiled variant exactly as Triton does (Triton's own binder, cache
  key and cache, for a call that has run through ``kernel[grid](...)`` once) and returns a
  ``CLaunch``: the variant's C launcher with every argument but the per-step ones bound;
* ``CLaunch.__call__`` launches it on a grid, a stream and the step's values (integers;
  pointers as integer addresses, which the launcher takes as they are).

What stays the caller's job: choosing, per step, the variant Triton would choose. A caller
keys its ``CLaunch`` objects by everything Triton's key reads from the per-step values: the
kernel's compile-time constants, and for each per-step pointer whether it is 16-byte aligned
(its integers are ``do_not_specialize`` and checked to fit in int32).
``triton_choice`` answers the question the tests ask: which compiled variant would
``kernel[grid](...)`` launch for these arguments?

It relies on Triton internals (``JITFunction.device_caches``, ``CompiledKernel.run.launch``
and the argument order of the generated C launcher), so it runs only on the versions it was
verified on (``VERIFIED``: 3.6.0 on an NVIDIA H200), only on the CUDA backend, never under the
CPU interpreter (which has no compiled kernel), and not while a launch hook (a profiler) is
set; ``SLOTMAP_C_LAUNCH=0`` turns it off. Everywhere else the callers launch through
``kernel[grid](...)``. triton-ascend's launcher differs: the NPU keeps the JIT path.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import triton

from slotmap.backend import BACKEND

VERIFIED = ("3.6",)  # Triton major.minor versions this adapter was checked on (GPU tests)
ENV = "SLOTMAP_C_LAUNCH"  # "0": always launch through kernel[grid](...)


def supported(version: str = triton.__version__, backend: str | None = None) -> bool:
    """Whether the fast path may run: a verified Triton on the CUDA backend, not turned off."""
    backend = BACKEND.name if backend is None else backend
    if backend != "cuda" or os.environ.get(ENV, "1") == "0":
        return False
    return ".".join(version.split(".")[:2]) in VERIFIED


def hooks_set() -> bool:
    """A launch hook (a profiler's) wants each launch's metadata: the JIT path gives it."""
    knobs = triton.knobs.runtime
    return bool(knobs.launch_enter_hook.calls or knobs.launch_exit_hook.calls)


def _no_cuda(*args: Any) -> int:
    raise RuntimeError("this torch has no CUDA")


# The current CUDA device's index, as ``torch.cuda.current_device`` reads it, and a device's
# current stream, as Triton's CUDA driver reads it for a launch: torch's own C functions.
current_device = getattr(torch._C, "_cuda_getDevice", _no_cuda)
current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", _no_cuda)


def bind(kernel: Any, args: tuple, kwargs: dict) -> tuple[Any, dict]:
    """JITFunction.run's own steps up to its cache lookup, for ``kernel[grid](*args,
    **kwargs)`` on the current device: (the compiled variant or None, the bound arguments in
    parameter order, as the JIT passes them to ``CompiledKernel.run``)."""
    from triton.runtime.jit import compute_cache_key

    device = triton.runtime.driver.active.get_current_device()
    kernel_cache, key_cache, _, _, binder = kernel.device_caches[device]
    # The two options JITFunction.run adds to every call's keyword arguments.
    kwargs = dict(kwargs)
    kwargs["debug"] = kwargs.get("debug", kernel.debug) or triton.knobs.runtime.debug
    kwargs["instrumentation_mode"] = triton.knobs.compilation.instrumentation_mode
    bound, specialization, options = binder(*args, **kwargs)
    compiled = kernel_cache.get(compute_cache_key(key_cache, specialization, options))
    if compiled is not None and hasattr(compiled, "result"):  # an asynchronous compile
        compiled = compiled.result()
    return compiled, bound


def triton_choice(kernel: Any, args: tuple, kwargs: dict) -> Any:
    """The compiled variant ``kernel[grid](*args, **kwargs)`` would launch on the current
    device, by Triton's own binder and cache key; None if it has not been compiled."""
    return bind(kernel, args, kwargs)[0]


class CLaunch:
    """One compiled variant's C launch with its fixed arguments bound.

    ``per_step``: the parameter names whose values each launch supplies. ``call(grid0,
    grid1, grid2, stream, *values)`` (the values in ``per_step``'s order) makes the launch in
    one Python call: a function generated for the variant, as Triton generates its binder,
    whose fixed arguments are its own defaults."""

    __slots__ = ("compiled", "call", "names", "per_step")

    def __init__(self, compiled: Any, names: list[str], values: list, per_step: tuple) -> None:
        run = compiled.run  # Triton's CudaLauncher for this variant (loads the module)
        self.compiled = compiled
        self.names, self.per_step = tuple(names), tuple(per_step)
        # Between the grid and the kernel's arguments, as CudaLauncher.__call__ passes them:
        # stream, function, cooperative grid, PDL, no scratch buffers, the packed metadata,
        # and no launch metadata or hooks (``hooks_set`` sends hooked launches the JIT way).
        head = (
            compiled.function,
            run.launch_cooperative_grid,
            run.launch_pdl,
            None,
            None,
            compiled.packed_metadata,
            None,
            None,
            None,
        )
        namespace: dict[str, Any] = {"launch_": run.launch}
        namespace |= {f"h{i}": value for i, value in enumerate(head)}
        arguments = []
        for i, (name, value) in enumerate(zip(names, values, strict=True)):
            if name in per_step:
                arguments.append(f"v{per_step.index(name)}")
            else:
                # A fixed tensor by address (the launcher takes an int as it is): the caller
                # keeps it alive and unchanged (the mappers check their geometry every step).
                namespace[f"a{i}"] = value.data_ptr() if isinstance(value, torch.Tensor) else value
                arguments.append(f"a{i}")
        fixed = [name for name in namespace]
        source = (
            f"def call(g0, g1, g2, stream, {', '.join(f'v{i}' for i in range(len(per_step)))}, "
            f"*, {', '.join(f'{n}={n}' for n in fixed)}):\n"
            f"    launch_(g0, g1, g2, stream, {', '.join(f'h{i}' for i in range(len(head)))}, "
            f"{', '.join(arguments)})\n"
        )
        exec(source, namespace)  # noqa: S102 - built from parameter names only
        self.call = namespace["call"]

    def __call__(self, grid0: int, grid1: int, grid2: int, stream: int, values: tuple) -> None:
        self.call(grid0, grid1, grid2, stream, *values)


def resolve(kernel: Any, args: tuple, kwargs: dict, per_step: tuple) -> CLaunch | None | bool:
    """The ``CLaunch`` of the variant ``kernel[grid](*args, **kwargs)`` launched (call it
    through the JIT once first); None if it has not been compiled; False where the fast path
    cannot take it (a variant that needs scratch memory or tensor descriptors, or not a
    ``@triton.jit`` function at all)."""
    if not isinstance(kernel, triton.runtime.jit.JITFunction):
        return False
    compiled, bound = bind(kernel, args, kwargs)
    if compiled is None:
        return None
    metadata = compiled.metadata
    if metadata.global_scratch_size or metadata.profile_scratch_size:
        return False  # CudaLauncher allocates these per launch
    if any(str(kind).startswith("tensordesc") for kind in compiled.src.signature.values()):
        return False
    names = list(bound)
    if [p.name for p in kernel.params] != names:  # the binder's order is the launcher's
        return False
    return CLaunch(compiled, names, list(bound.values()), per_step)
