"""Choose the backend once, before any Triton kernel is decorated.

Order: the ``SLOTMAP_BACKEND`` environment variable (``npu``, ``cuda`` or ``cpu``) if set,
else an Ascend NPU (triton-ascend + torch_npu), else an NVIDIA GPU, else the CPU through
Triton's interpreter.

Two settings exist for checking the NPU path on a machine without an NPU:

* ``SLOTMAP_BACKEND=ascend-ir``: compile only. Kernels are decorated as compiled Triton
  functions (no interpreter) so that triton-ascend's compiler can lower them
  (``slotmap.ascend``); nothing is launched.
* ``SLOTMAP_LAUNCH_POLICY=npu|cuda|cpu``: the launch choices (tiles, grids, gather mode,
  GPU-only variants) of another backend, while the kernels still run where the backend says.
  The CPU interpreter under the NPU's policy runs exactly the launches an NPU would get.

Importing ``slotmap`` does not import this module: the choice is made when a kernel module
is first imported (``slotmap.kernels`` imports this module first), and never initialises CUDA
(``torch.cuda.is_available`` only) or prints. On the CPU the choice sets ``TRITON_INTERPRET=1``,
which Triton reads when ``@triton.jit`` decorates and again when an interpreted kernel runs.
``announce`` prints the one line the course shows (``slotmap.course``, the command line).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from slotmap import launch_log
from slotmap.i18n import _

BACKENDS = ("npu", "cuda", "cpu")
COMPILE_ONLY = "ascend-ir"  # SLOTMAP_BACKEND value: decorate for triton-ascend, launch nothing
ENV_VAR = "SLOTMAP_BACKEND"
POLICY_VAR = "SLOTMAP_LAUNCH_POLICY"
QUIET_VAR = "SLOTMAP_QUIET"  # "1": ``announce`` prints nothing (the ranks of a distributed run)


@dataclass(frozen=True)
class Backend:
    name: str  # "npu", "cuda" or "cpu"
    device: str  # the torch device kernels run on
    reason: str  # why this backend was chosen, in words
    policy: str = ""  # whose launch choices to make: "npu", "cuda" or "cpu" ("": the name's)

    def __post_init__(self) -> None:
        if not self.policy:
            object.__setattr__(self, "policy", self.name)

    @property
    def interpreted(self) -> bool:
        return self.name == "cpu"


def _npu_available() -> tuple[bool, str]:
    # torch_npu cannot be imported without Huawei's CANN toolkit, and a broken install can
    # raise anything at import: probe defensively and never let it take slotmap down.
    if importlib.util.find_spec("torch_npu") is None:
        return False, _("torch_npu is not installed")
    try:
        importlib.import_module("torch_npu")
        import torch

        if torch.npu.is_available():  # type: ignore[attr-defined]
            return True, _("torch_npu sees an Ascend NPU")
        return False, _("torch_npu is installed but sees no NPU")
    except Exception as exc:  # noqa: BLE001 - any failure means "no NPU"
        return False, _("torch_npu failed to import ({error})").format(
            error=f"{type(exc).__name__}: {exc}"
        )


def _cuda_available() -> tuple[bool, str]:
    import torch

    # is_available, not get_device_name: naming the device would initialise CUDA, which an
    # engine must be free to do after it forks its workers.
    if torch.cuda.is_available():
        return True, _("torch sees a CUDA device")
    return False, _("torch sees no CUDA device")


def _choose() -> Backend:
    forced = os.environ.get(ENV_VAR, "").strip().lower()
    if forced == COMPILE_ONLY:
        if os.environ.get("TRITON_INTERPRET") == "1":
            # Interpreted kernels cannot be compiled: say so instead of failing per kernel.
            raise ValueError(
                _("{setting} compiles the kernels: unset TRITON_INTERPRET").format(
                    setting=f"{ENV_VAR}={COMPILE_ONLY}"
                )
            )
        reason = _("{setting}: compile only").format(setting=f"{ENV_VAR}={forced}")
        return Backend(COMPILE_ONLY, "cpu", reason, "npu")
    if forced:
        if forced not in BACKENDS:
            raise ValueError(
                _(
                    "{setting}: expected one of {backends} "
                    "(or {compile_only} to compile for triton-ascend without launching)"
                ).format(
                    setting=f"{ENV_VAR}={forced!r}",
                    backends=", ".join(BACKENDS),
                    compile_only=COMPILE_ONLY,
                )
            )
        reason = f"{ENV_VAR}={forced}"
        if forced == "npu":
            ok, why = _npu_available()
            if not ok:
                raise RuntimeError(_("{setting}, but {why}").format(setting=reason, why=why))
            importlib.import_module("torch_npu")
        elif forced == "cuda":
            ok, why = _cuda_available()
            if not ok:
                raise RuntimeError(_("{setting}, but {why}").format(setting=reason, why=why))
        return Backend(forced, forced, reason)
    if os.environ.get("TRITON_INTERPRET") == "1":
        return Backend("cpu", "cpu", _("{setting} is set").format(setting="TRITON_INTERPRET=1"))
    ok, why = _npu_available()
    if ok:
        return Backend("npu", "npu", why)
    ok_cuda, why_cuda = _cuda_available()
    if ok_cuda:
        return Backend("cuda", "cuda", why_cuda)
    reason = _("no accelerator ({npu}; {cuda})").format(npu=why, cuda=why_cuda)
    return Backend("cpu", "cpu", reason)


def _activate(backend: Backend) -> None:
    if backend.interpreted:
        late = "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1"
        os.environ["TRITON_INTERPRET"] = "1"
        if late:
            _reinterpret_triton_language()


def _reinterpret_triton_language() -> None:
    """Triton was imported before slotmap set ``TRITON_INTERPRET=1``: ``triton.language``'s own
    ``@jit`` helpers (``tl.min``, ``tl.cdiv``, ...) were built for the compiler, and an
    interpreted kernel that calls one dies with "Cannot call @triton.jit'd outside of the scope
    of a kernel". ``@triton.jit`` reads the variable when it decorates, so decorate them again.

    Kernels the learner decorated before this point stay compiled: say so in one line."""
    import triton
    from triton.runtime.jit import JITFunction

    redone: dict[int, Any] = {}

    def again(old: JITFunction) -> Any:
        if id(old) not in redone:
            redone[id(old)] = triton.jit(old.fn, noinline=getattr(old, "noinline", None))
        return redone[id(old)]

    def member(function: Any) -> Callable[..., Any]:
        # What triton.language gives tensor for x.max() when it is imported interpreted.
        def call(*args: Any, **kwargs: Any) -> Any:
            return function(*args, **kwargs)

        return call

    for name, module in list(sys.modules.items()):
        if module is None or not (name + ".").startswith("triton.language."):
            continue
        for attr, value in list(getattr(module, "__dict__", {}).items()):
            if isinstance(value, JITFunction):
                setattr(module, attr, again(value))
    tensor = sys.modules["triton.language"].tensor
    for attr, value in list(vars(tensor).items()):
        if isinstance(value, JITFunction):
            setattr(tensor, attr, member(again(value)))
    with warnings.catch_warnings():  # isinstance on a deprecated module attribute warns
        warnings.simplefilter("ignore")
        found = {  # one module can sit in sys.modules under two names (__main__, __mp_main__)
            id(value): f"{getattr(module, '__name__', '?')}.{attr}"
            for name, module in list(sys.modules.items())
            if module is not None and not name.startswith("triton")
            for attr, value in list(getattr(module, "__dict__", {}).items())
            if isinstance(value, JITFunction)
        }
    compiled = list(found.values())
    if compiled:
        names = ", ".join(compiled[:3]) + (", ..." if len(compiled) > 3 else "")
        print(
            f"slotmap: warning: {names} {'was' if len(compiled) == 1 else 'were'} decorated "
            "before slotmap chose the CPU interpreter and cannot run: restart the kernel and "
            "import slotmap before triton",
            file=sys.stderr,
        )


def _with_policy(backend: Backend) -> Backend:
    policy = os.environ.get(POLICY_VAR, "").strip().lower()
    if not policy:
        return backend
    if policy not in BACKENDS:
        raise ValueError(
            _("{setting}: expected one of {backends}").format(
                setting=f"{POLICY_VAR}={policy!r}", backends=", ".join(BACKENDS)
            )
        )
    reason = f"{backend.reason}; {POLICY_VAR}={policy}"
    return Backend(backend.name, backend.device, reason, policy)


def describe() -> str:
    """The backend in one line, naming the GPU (which initialises CUDA: the course's line)."""
    if BACKEND.interpreted:
        where = _("Triton interpreter on the CPU")
    elif BACKEND.name == COMPILE_ONLY:
        where = _("kernels compiled for triton-ascend, never launched")
    else:
        where = _("Triton on {device}").format(device=DEVICE)
    reason = BACKEND.reason
    sees = _("torch sees a CUDA device")
    if BACKEND.name == "cuda" and reason.startswith(sees):
        import torch

        named = _("torch sees {gpu}").format(gpu=torch.cuda.get_device_name(0))
        reason = reason.replace(sees, named, 1)
    return _("slotmap: backend {name} ({where}; {reason})").format(
        name=BACKEND.name, where=where, reason=reason
    )


def announce() -> None:
    """Print ``describe()`` once per process (not in the ranks, which set SLOTMAP_QUIET)."""
    global _announced
    if not _announced and os.environ.get(QUIET_VAR) != "1":
        print(describe())
    _announced = True


_announced = False
BACKEND: Backend = _with_policy(_choose())
_activate(BACKEND)
DEVICE: str = BACKEND.device
if os.environ.get(launch_log.RECORD_VAR) and BACKEND.interpreted:
    launch_log.start(os.environ[launch_log.RECORD_VAR])
