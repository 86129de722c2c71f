"""``import slotmap`` is a library import: no output, no environment change, no accelerator.

Each case runs in a fresh interpreter, the only honest way to see what an import does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import slotmap

ROOT = Path(__file__).resolve().parents[1]


def fresh_python(code: str, **env: str) -> subprocess.CompletedProcess:
    # Without the variables that choose a backend, as an engine's process starts.
    environment = {
        k: v
        for k, v in os.environ.items()
        if k not in ("SLOTMAP_BACKEND", "SLOTMAP_LAUNCH_POLICY", "TRITON_INTERPRET")
    }
    environment.update(env, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=environment,
        cwd=ROOT,
        timeout=300,
    )


def test_import_prints_nothing_and_leaves_the_environment_and_torch_alone() -> None:
    code = (
        "import json, os, sys\n"
        "before = dict(os.environ)\n"
        "import slotmap\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'triton'))\n"
        "print(json.dumps({'same_env': dict(os.environ) == before, 'loaded': loaded}))\n"
    )
    done = fresh_python(code)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert json.loads(done.stdout) == {"same_env": True, "loaded": []}


FAKE_GPU = """
import json, os, sys
import torch

def refuse(*args, **kwargs):
    raise AssertionError("CUDA initialised")

# A machine with a GPU, as torch reports it, where anything that would initialise CUDA fails.
torch.cuda.is_available = lambda: True
torch.cuda.get_device_name = refuse
torch.cuda.init = refuse
torch.cuda._lazy_init = refuse
torch.cuda.current_device = refuse
before = dict(os.environ)
import slotmap
launcher = slotmap.compute_slot_mapping  # loads the kernels: the backend is chosen here
print(json.dumps({"backend": slotmap.BACKEND.name, "same_env": dict(os.environ) == before,
                  "initialized": torch.cuda.is_initialized()}))
"""


def test_choosing_a_gpu_backend_does_not_initialise_cuda() -> None:
    # An engine forks its workers after importing its libraries: CUDA must still be untouched.
    done = fresh_python(FAKE_GPU)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {
        "backend": "cuda",
        "same_env": True,
        "initialized": False,
    }
    assert "slotmap: backend" not in done.stdout


def test_the_public_names_separate_launchers_from_references() -> None:
    assert set(slotmap.LAUNCHERS).isdisjoint(slotmap.REFERENCES)
    assert set(slotmap.__all__) == {
        *slotmap.LAUNCHERS,
        *slotmap.REFERENCES,
        *slotmap.LAYOUT,
        *slotmap.SERVING,
        *slotmap.BACKEND_NAMES,
    }
    for name in slotmap.__all__:
        assert getattr(slotmap, name) is not None
    assert all(
        getattr(slotmap, n).__module__.startswith("slotmap.kernels") for n in slotmap.LAUNCHERS
    )
    assert all(getattr(slotmap, n).__module__ == "slotmap.reference" for n in slotmap.REFERENCES)
