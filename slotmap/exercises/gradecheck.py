"""The judge of ``slotmap grade``, apart from the learner's kernel, and the thin runner in it.

The learner's code and the judge never share a process. The notebook's kernel runs the
learner's cells; ``slotmap grade``'s worker (``gradeworker.py``, the grader's own process)
runs the judge (``Judge``): the exercise's cases, hypothesis, the reference and the verdict.
A restored check cell runs only ``serve`` in the kernel: it connects to the judge's socket
and runs the candidate (the learner's function, or their kernel launched by
``checked_launch``) on each input the judge sends, and sends back what came out (the return
value, and every tensor argument as the call left it, for kernels that write ``out``).

Only data crosses from the kernel: tensors, numbers, strings, lists, dicts, slotmap's own
dataclasses, read with ``torch.load(weights_only=True)`` (no code runs on loading), and an
exception as its type's name and message. The verdict is written by the worker, never by
the kernel; a ``Skipped`` counts only when the judge itself raised it. What the learner's
code can still do is compute the outputs in any way it likes (calling slotmap's own
reference, say) and fake what the kernel measures about itself (out-of-bounds reads, timings).

This file imports nothing from ``slotmap`` at the top: the worker imports it before torch.
"""

from __future__ import annotations

import builtins
import io
import socket
import struct
import threading
import traceback
from typing import Any

MAX_MESSAGE = 1 << 30  # bytes one message from the kernel may have
# Library functions a judge calls with the candidate as its first argument, which must run
# where the candidate is (ranks it spawns, a CUDA graph it is timed in): "module:name".
REMOTE_HELPERS = (
    "slotmap.distributed:run_ranks",
    "slotmap.exercises.lesson09:measure_fused_time",
)
# Context managers a judge wraps a launch in to watch the kernel run (the interpreter's
# calls): entered where the kernel runs, and what they saw sent back into the judge's list.
REMOTE_CONTEXTS = ("slotmap.exercises.lesson03:_watched_gathers",)
_HEADER = struct.Struct("!Q")


# ---------------------------------------------------------------------------------------------
# Messages: a length, then torch.save's bytes
# ---------------------------------------------------------------------------------------------
def _send(sock: socket.socket, value: Any) -> None:
    import torch

    buffer = io.BytesIO()
    torch.save(value, buffer)
    payload = buffer.getvalue()
    sock.sendall(_HEADER.pack(len(payload)) + payload)


def _receive_bytes(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise EOFError("the kernel hung up")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _receive(sock: socket.socket, trusted: bool) -> Any:
    """One message; from the kernel (``trusted`` False) only as data, never code."""
    import torch

    (size,) = _HEADER.unpack(_receive_bytes(sock, _HEADER.size))
    if size > MAX_MESSAGE:
        raise EOFError(f"a message of {size} bytes from the kernel")
    payload = io.BytesIO(_receive_bytes(sock, size))
    return torch.load(payload, weights_only=not trusted, map_location=None)


# ---------------------------------------------------------------------------------------------
# Values as data: what the kernel sends, and what the judge makes of it
# ---------------------------------------------------------------------------------------------
def _encode(value: Any, tensors: dict[int, int], depth: int = 0) -> Any:
    """``value`` as plain data (kernel side): a tensor argument as its index."""
    import dataclasses
    import numbers

    import torch

    if value is None or type(value) in (bool, int, float, str):
        return value
    if isinstance(value, torch.Tensor):
        index = tensors.get(id(value))
        return {"__argument__": index} if index is not None else value.detach()
    if depth < 8 and type(value) in (list, tuple):
        encoded = [_encode(v, tensors, depth + 1) for v in value]
        return encoded if type(value) is list else tuple(encoded)
    if depth < 8 and type(value) is dict and all(type(k) is str for k in value):
        return {k: _encode(v, tensors, depth + 1) for k, v in value.items()}
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    kind = type(value)
    if kind.__module__.startswith("triton.language") and kind.__name__ == "dtype":
        return {"__triton_dtype__": str(value.name)}
    if depth < 8 and dataclasses.is_dataclass(value) and kind.__module__.startswith("slotmap."):
        fields = {
            f.name: _encode(getattr(value, f.name), tensors, depth + 1)
            for f in dataclasses.fields(value)
            if f.init
        }
        return {"__dataclass__": f"{kind.__module__}:{kind.__qualname__}", "fields": fields}
    return {"__opaque__": kind.__name__, "repr": repr(value)[:200]}


class Opaque:
    """A value the kernel returned that does not cross as data: its type's name and repr."""

    text = ""

    def __repr__(self) -> str:
        return self.text


def _opaque(name: str, text: str) -> Opaque:
    name = name if name.isidentifier() else "object"
    return type(name, (Opaque,), {"text": text})()


def _resolve(path: str) -> Any:
    import importlib

    module, _, name = path.partition(":")
    if not module.startswith("slotmap."):
        return None
    target: Any = importlib.import_module(module)
    for part in name.split("."):
        target = getattr(target, part, None)
    return target


def _decode(value: Any, arguments: list[Any], depth: int = 0) -> Any:
    """The judge's value for data the kernel sent (judge side)."""
    import dataclasses

    if depth > 16:
        return _opaque("object", "...")
    if isinstance(value, list):
        return [_decode(v, arguments, depth + 1) for v in value]
    if isinstance(value, tuple):
        return tuple(_decode(v, arguments, depth + 1) for v in value)
    if not isinstance(value, dict):
        return value
    if set(value) == {"__argument__"} and isinstance(value["__argument__"], int):
        index = value["__argument__"]
        return arguments[index] if 0 <= index < len(arguments) else None
    if set(value) == {"__triton_dtype__"}:
        import triton.language as tl

        try:
            return tl.dtype(str(value["__triton_dtype__"]))
        except (TypeError, ValueError, AssertionError):
            return _opaque("dtype", str(value["__triton_dtype__"]))
    if set(value) == {"__opaque__", "repr"}:
        return _opaque(str(value["__opaque__"]), str(value["repr"]))
    if set(value) == {"__dataclass__", "fields"} and isinstance(value["fields"], dict):
        kind = _resolve(str(value["__dataclass__"]))
        if isinstance(kind, type) and dataclasses.is_dataclass(kind):
            try:
                return kind(
                    **{k: _decode(v, arguments, depth + 1) for k, v in value["fields"].items()}
                )
            except Exception:  # fields that do not make one: an object of no use to the judge
                pass
        return _opaque(str(value["__dataclass__"]).rpartition(".")[2], "a dataclass")
    return {k: _decode(v, arguments, depth + 1) for k, v in value.items()}


def _remote_error(info: dict[str, Any]) -> BaseException:
    """The judge's exception for one raised in the kernel: of the same builtin (or slotmap)
    class where there is one, so that a judge's ``except ValueError`` still holds."""
    from slotmap.exercises.core import RemoteError

    name = str(info.get("type", "Exception"))
    module = str(info.get("module", ""))
    base: type = Exception
    if info.get("stub") is True:
        base = NotImplementedError
    elif module == "builtins" and isinstance(getattr(builtins, name, None), type):
        found = getattr(builtins, name)
        base = found if issubclass(found, Exception) else Exception
    elif module.startswith("slotmap."):
        found = _resolve(f"{module}:{name}")
        base = found if isinstance(found, type) and issubclass(found, Exception) else Exception
    if name == "Skipped" or not name.isidentifier():  # only the judge's own Skipped skips
        name = "RemoteError" if not name.isidentifier() else name
        base = Exception if base is not NotImplementedError else base
    kind = type(name, (RemoteError,) if base is Exception else (RemoteError, base), {})
    error = kind.__new__(kind)
    error.args = (str(info.get("message", "")),)
    error.message = str(info.get("message", ""))
    error.where = str(info.get("where", ""))
    return error


# ---------------------------------------------------------------------------------------------
# The judge's side: the candidate as a proxy, one connection per check
# ---------------------------------------------------------------------------------------------
# The judge's watching contexts now open (REMOTE_CONTEXTS), and the list each filled.
_WATCHING: list[tuple[str, list]] = []


class _Channel:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def request(self, op: str, target: Any, args: tuple, kwargs: dict) -> Any:
        import torch

        from slotmap.exercises.core import Wrong

        watching = list(_WATCHING)
        request = {"op": op, "target": target, "args": args, "kwargs": kwargs}
        _send(self.sock, dict(request, contexts=[path for path, _ in watching]))
        reply = _receive(self.sock, trusted=False)
        if not isinstance(reply, dict):
            raise _remote_error({"type": "RemoteError", "message": "a malformed reply"})
        seen = reply.get("contexts") if isinstance(reply.get("contexts"), list) else []
        for (_, own), found in zip(watching, seen, strict=False):
            own.extend(_decode(found, []) if isinstance(found, list) else [])
        # What a kernel wrote into its tensor arguments, storage and all (guard bands too).
        mine = [a for a in [*args, *kwargs.values()] if isinstance(a, torch.Tensor)]
        theirs = reply.get("tensors") if isinstance(reply.get("tensors"), list) else []
        for own, written in zip(mine, theirs, strict=False):
            if (
                isinstance(written, torch.Tensor)
                and written.dtype == own.dtype
                and written.untyped_storage().nbytes() == own.untyped_storage().nbytes()
            ):
                own.untyped_storage().copy_(written.untyped_storage())
        if isinstance(reply.get("wrong"), dict):
            w = reply["wrong"]
            wrong = Wrong(*(str(w.get(k, "")) for k in ("invariant", "expected", "got", "hint")))
            # What broke, which the judge reads instead of the (translated) words: it only
            # refines the report of a check that fails anyway.
            if w.get("kind") == "out_of_bounds" and type(w.get("read_index")) is int:
                wrong.kind, wrong.read_index = "out_of_bounds", w["read_index"]
            raise wrong
        if isinstance(reply.get("error"), dict):
            raise _remote_error(reply["error"])
        return _decode(reply.get("value"), mine)


class RemoteCandidate:
    """The learner's callable, called in the kernel."""

    def __init__(self, channel: _Channel, name: str) -> None:
        self._channel = channel
        self.__name__ = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._channel.request("call", None, args, kwargs)


class RemoteIndexable(RemoteCandidate):
    """The learner's kernel (anything indexable): ``kernel[grid](...)`` launches it there."""

    arg_names: list[str] = []

    def __getitem__(self, grid: Any) -> Any:
        return lambda *args, **kwargs: self._channel.request("launch", grid, args, kwargs)


class RemoteKernel(RemoteIndexable):
    def run(self, *args: Any, **kwargs: Any) -> Any:  # a JITFunction has one
        raise TypeError("launch the kernel as kernel[grid](...)")


def _proxy(channel: _Channel, hello: dict[str, Any]) -> Any:
    kind = str(hello.get("kind"))
    type_name = str(hello.get("type", "object"))
    base = {"kernel": RemoteKernel, "indexable": RemoteIndexable, "callable": RemoteCandidate}
    if kind not in base:
        return _decode(hello.get("value"), [])
    cls = type(type_name if type_name.isidentifier() else "object", (base[kind],), {})
    proxy = cls(channel, str(hello.get("name", "candidate")))
    if isinstance(hello.get("arg_names"), list):
        proxy.arg_names = [str(a) for a in hello["arg_names"]]
    return proxy


class _Helpers:
    """While a check runs, the ``REMOTE_HELPERS`` called on a proxy run in the kernel."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def __enter__(self) -> _Helpers:
        import importlib

        self.lock.acquire()
        self.saved = []
        for paths, wrap in ((REMOTE_HELPERS, self._wrap), (REMOTE_CONTEXTS, self._watch)):
            for path in paths:
                module_name, _, name = path.partition(":")
                module = importlib.import_module(module_name)
                original = getattr(module, name)
                self.saved.append((module, name, original))
                setattr(module, name, wrap(path, original))
        return self

    def __exit__(self, *_: object) -> None:
        for module, name, original in self.saved:
            setattr(module, name, original)
        self.lock.release()

    @staticmethod
    def _wrap(path: str, original: Any) -> Any:
        def helper(candidate: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(candidate, RemoteCandidate):
                return candidate._channel.request("apply", path, args, kwargs)
            return original(candidate, *args, **kwargs)

        return helper

    @staticmethod
    def _watch(path: str, original: Any) -> Any:
        import contextlib

        @contextlib.contextmanager
        def watch(*args: Any, **kwargs: Any) -> Any:
            with original(*args, **kwargs) as seen:
                if not isinstance(seen, list):  # nothing to watch on this backend
                    yield seen
                    return
                _WATCHING.append((path, seen))
                try:
                    yield seen
                finally:
                    _WATCHING.remove((path, seen))

        return watch


class Judge:
    """The worker's judge: accepts the kernel's connection while a check cell runs
    (``open``) for that cell's exercises, checks each, and keeps the verdicts (``close``)."""

    def __init__(self, path: str, timeout: float = 3600) -> None:
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(path)
        self.server.listen(8)
        self.timeout = timeout
        self.lock = threading.Lock()
        self.cell: int | None = None
        self.exercises: list[str] = []
        self.records: list[dict[str, Any]] = []
        self.busy: list[threading.Thread] = []
        self.helpers = _Helpers()
        threading.Thread(target=self._accept, daemon=True).start()

    def preload(self) -> None:
        """Import the checking code now, while the kernel starts."""
        threading.Thread(target=self._import, daemon=True).start()

    @staticmethod
    def _import() -> None:
        import contextlib

        with contextlib.redirect_stdout(io.StringIO()):
            import slotmap.exercises.cases  # noqa: F401

    def open(self, cell: int, exercises: list[str]) -> None:
        with self.lock:
            self.cell, self.exercises, self.records, self.busy = cell, list(exercises), [], []

    def close(self, wait: float = 60) -> list[dict[str, Any]]:
        """The verdicts of the cell that ran; a check still running then is a failure."""
        with self.lock:
            cell, self.cell, busy = self.cell, None, list(self.busy)
        for thread in busy:
            thread.join(wait)
        with self.lock:
            records = list(self.records)
        done = [r["exercise"] for r in records]
        for thread in busy:
            if thread.is_alive():
                exercise = getattr(thread, "exercise", "")
                if exercise not in done:
                    records.append({"exercise": exercise, "passed": False, "cell": cell})
        return records

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            with self.lock:
                if self.cell is None:  # no check cell is running: nothing to answer
                    conn.close()
                    continue
                self.busy.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(self.timeout)
            try:
                hello = _receive(conn, trusted=False)
            except Exception:
                return
            with self.lock:
                cell, wanted = self.cell, self.exercises
                exercise = hello.get("exercise") if isinstance(hello, dict) else None
                taken = [r["exercise"] for r in self.records]
                if cell is None or exercise not in wanted:
                    return
                threading.current_thread().exercise = exercise  # type: ignore[attr-defined]
                if exercise in taken:  # a second connection for one exercise: a failure
                    for record in self.records:
                        if record["exercise"] == exercise:
                            record.update(passed=False, twice=True)
                            record.pop("skipped", None)
                    return
                record: dict[str, Any] = {"exercise": exercise, "passed": False, "cell": cell}
                self.records.append(record)
            text = self._check(conn, hello, exercise, record)
            try:
                _send(conn, {"op": "done", "target": text, "args": (), "kwargs": {}})
            except OSError:
                pass

    def _check(
        self, conn: socket.socket, hello: dict[str, Any], exercise_id: str, record: dict
    ) -> str:
        from slotmap.exercises import core

        exercise = core.get_exercise(exercise_id)
        max_examples = hello.get("max_examples")
        max_examples = max_examples if type(max_examples) is int and max_examples > 0 else None
        with self.helpers:
            result = core.run_check(
                exercise, _proxy(_Channel(conn), hello), max_examples=max_examples
            )
        with self.lock:
            if not record.get("twice"):
                record["passed"] = result.passed is True
                if result.skipped:
                    record["skipped"] = str(result.skipped)
        return result.report()


# ---------------------------------------------------------------------------------------------
# The kernel's side: the thin runner a restored check cell calls
# ---------------------------------------------------------------------------------------------
def _describe(candidate: Any, exercise_id: str, max_examples: Any) -> dict[str, Any]:
    hello: dict[str, Any] = {
        "exercise": exercise_id,
        "type": type(candidate).__name__,
        "name": str(getattr(candidate, "__name__", type(candidate).__name__)),
        "max_examples": max_examples if type(max_examples) is int else None,
    }
    if hasattr(candidate, "__getitem__") and hasattr(candidate, "run"):
        hello["kind"] = "kernel"
        holder = getattr(candidate, "kernel", candidate)
        names = getattr(candidate, "arg_names", None) or getattr(holder, "arg_names", None)
        hello["arg_names"] = [str(n) for n in names or []]
    elif callable(candidate):
        hello["kind"] = "callable"
    elif hasattr(candidate, "__getitem__") and not isinstance(candidate, (list, tuple, dict, str)):
        hello["kind"] = "indexable"
    else:
        hello["kind"] = "value"
        hello["value"] = _encode(candidate, {})
    return hello


def _error_info(error: BaseException) -> dict[str, Any]:
    from slotmap.exercises.core import _is_library_frame, _is_stub

    where = ""
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        if not _is_library_frame(frame.filename) and frame.filename != __file__:
            where = f" in {frame.name}, line {frame.lineno}: {(frame.line or '').strip()}"
            break
    return {
        "type": type(error).__name__,
        "module": type(error).__module__,
        "message": str(error),
        "where": where,
        "stub": _is_stub(error),
    }


def _run(candidate: Any, request: dict[str, Any]) -> Any:
    """Run one request of the judge on the candidate (kernel side)."""
    import importlib

    op, target = request["op"], request["target"]
    args, kwargs = request["args"], request["kwargs"]
    if op == "call":
        return candidate(*args, **kwargs)
    if op == "launch":
        if hasattr(candidate, "run"):
            from slotmap.exercises.cases import checked_launch

            return checked_launch(candidate, target, *args, **kwargs)
        return candidate[target](*args, **kwargs)
    if op == "apply" and target in REMOTE_HELPERS:
        module, _, name = target.partition(":")
        return getattr(importlib.import_module(module), name)(candidate, *args, **kwargs)
    raise ValueError(f"unknown request {op!r}")


def _serve_one(sock: socket.socket, exercise_id: str, candidate: Any, options: dict) -> str:
    import contextlib

    import torch

    from slotmap.exercises.core import Wrong

    _send(sock, _describe(candidate, exercise_id, options.get("max_examples")))
    while True:
        request = _receive(sock, trusted=True)
        if request["op"] == "done":
            return str(request["target"])
        tensors = [
            a
            for a in [*request["args"], *request["kwargs"].values()]
            if isinstance(a, torch.Tensor)
        ]
        reply: dict[str, Any] = {}
        watched: list[Any] = []
        try:
            with contextlib.ExitStack() as stack:
                for path in request.get("contexts", []):
                    if path in REMOTE_CONTEXTS:
                        watched.append(stack.enter_context(_resolve(path)()))
                value = _run(candidate, request)
            reply["value"] = _encode(value, {id(t): i for i, t in enumerate(tensors)})
        except Wrong as wrong:  # an out-of-bounds read, seen where the kernel ran
            reply["wrong"] = {
                k: str(getattr(wrong, k)) for k in ("invariant", "expected", "got", "hint")
            }
            index = getattr(wrong, "read_index", None)
            if wrong.kind == "out_of_bounds" and type(index) is int:
                reply["wrong"].update(kind=wrong.kind, read_index=index)
        except Exception as error:  # the learner's code can raise anything
            reply["error"] = _error_info(error)
        reply["tensors"] = [t.detach() for t in tensors]
        reply["contexts"] = [_encode(list(w or []), {}) for w in watched]
        _send(sock, reply)


def serve(*, address: str, cell: int, source: str, namespace: dict) -> None:
    """Run a check cell's ``source`` in the kernel with a ``check`` that lets the grader's judge
    run the candidate here; the verdict is the judge's, not this cell's."""

    def check(exercise_id: str, candidate: Any, **options: Any) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(address)
            print(_serve_one(sock, exercise_id, candidate, options))
        except (OSError, EOFError) as error:
            print(f"slotmap grade: the judge of {exercise_id} was not reached ({error})")
        finally:
            sock.close()

    exec(source, dict(namespace, check=check))
