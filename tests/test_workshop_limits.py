"""The learners' memory and CPU limits (slotmap.workshop.limits): under systemd each learner's
server is a systemd unit with MemoryMax and CPUQuota, started by jupyterhub-systemdspawner
with what the workshop's config gives every learner; without systemd the servers stay plain
processes and the hub's log and the pre-flight say that nothing limits them."""

from __future__ import annotations

import asyncio
import logging
import os
import pwd
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_workshop import ROOT, _load_hub_config

from slotmap.workshop import limits, preflight


def _fake_systemd(folder: Path) -> Path:
    """systemd-run and systemctl for a machine whose init is not systemd: systemd-run writes
    the command line it was given, then systemctl says the unit is active."""
    folder.mkdir()
    run = folder / "systemd-run"
    run.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {folder / "run-args"}\n')
    ctl = folder / "systemctl"
    ctl.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = --version ]; then echo "systemd 252"; exit 0; fi\n'
        f'if [ "$1" = is-active ] && [ -e {folder / "run-args"} ]; then exit 0; fi\n'
        "exit 3\n"
    )
    run.chmod(0o755)
    ctl.chmod(0o755)
    return folder


def test_under_systemd_each_learner_is_a_unit_with_its_limits(tmp_path, monkeypatch):
    systemdspawner = pytest.importorskip("systemdspawner")
    from jupyterhub.objects import Hub
    from systemdspawner import systemd

    config = _load_hub_config(tmp_path, monkeypatch)
    marker = tmp_path / "run-systemd-system"  # stands for /run/systemd/system
    marker.mkdir()
    environ = {"SLOTMAP_HUB_MEM_LIMIT": "2500M", "SLOTMAP_HUB_CPU_LIMIT": "1.5"}
    assert limits.configure(config, environ, systemd=marker) == limits.Limits("2500M", 1.5)
    assert config.JupyterHub.spawner_class == "systemd"

    # The spawner the hub would make for a learner (here the user running the test, who
    # exists on this machine), with the workshop's config.
    name = pwd.getpwuid(os.getuid()).pw_name
    user = SimpleNamespace(name=name, id=7, url=f"/user/{name}/", escaped_name=name, server=None)
    spawner = systemdspawner.SystemdSpawner(user=user, hub=Hub(), config=config)
    assert spawner.cmd == [sys.executable, "-m", "slotmap", "workshop", "learner-server"]
    records = "http://127.0.0.1:8002/services/workshop-dashboard/api/records"  # the dashboard's
    assert spawner.environment == {
        "SLOTMAP_COURSE_SOURCE": str(ROOT),
        "SLOTMAP_RECORDS_URL": records,
    }
    assert spawner.pre_spawn_hook.__name__ == "_create_learner"  # makes the learner's account
    assert "--MappingKernelManager.cull_connected=True" in spawner.args
    assert spawner.unit_name == f"jupyter-{name}"
    assert not spawner.dynamic_users

    # What it asks systemd for (systemd-run's command line).
    fake = _fake_systemd(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    monkeypatch.setattr(systemd, "RUN_ROOT", str(tmp_path / "run"))
    assert asyncio.run(spawner.start()) == ("127.0.0.1", spawner.port)
    run = (fake / "run-args").read_text().splitlines()
    assert run[:2] == ["--unit", f"jupyter-{name}"]
    assert f"--uid={os.getuid()}" in run  # the learner's own account, not a dynamic user
    properties = {arg.split("=", 1)[1] for arg in run if arg.startswith("--property=")}
    assert f"MemoryMax={2500 * 1024**2}" in properties
    assert "CPUQuota=150%" in properties
    assert {"PrivateTmp=yes", "NoNewPrivileges=yes"} <= properties
    assert not any(p.startswith("DynamicUser") for p in properties)
    command = [sys.executable, "-m", "slotmap", "workshop", "learner-server"]
    assert run[-len(command) - len(spawner.args) :] == command + spawner.args
    unit_environment = (tmp_path / "run" / f"jupyter-{name}" / f"jupyter-{name}.env").read_text()
    assert f"SLOTMAP_COURSE_SOURCE={ROOT}\n" in unit_environment
    assert f"SLOTMAP_RECORDS_URL={records}\n" in unit_environment


def test_without_systemd_the_servers_stay_local_and_say_why(tmp_path, monkeypatch, caplog):
    from traitlets.config import Config

    absent = tmp_path / "run-systemd-system"
    config = Config()
    config.JupyterHub.spawner_class = "localprocess"
    with caplog.at_level(logging.WARNING, logger="JupyterHub"):
        off = limits.configure(config, {}, systemd=absent)
    reason = f"systemd is not this machine's init ({absent} is missing)"
    assert off == limits.Limits(limits.DEFAULT_MEMORY, limits.DEFAULT_CPU, reason)
    assert config.JupyterHub.spawner_class == "localprocess"
    assert "SystemdSpawner" not in config
    assert f"Per-learner memory and CPU limits are OFF: {reason}" in caplog.messages
    assert preflight.limits_line({}, absent) == (
        True,
        f"limits       OFF: {reason}; learners share the machine's memory and cores",
    )
    # Under systemd too when asked, or when every learner is the hub's own user.
    absent.mkdir()
    for environ in ({"SLOTMAP_HUB_SPAWNER": "local"}, {"SLOTMAP_HUB_HOMES": "/tmp/{username}"}):
        assert limits.configure(config, environ, systemd=absent).off
        assert config.JupyterHub.spawner_class == "localprocess"
    ok, line = preflight.limits_line({}, absent)
    assert ok and line.startswith("limits       OK: ") and "CPUQuota=200%" in line

    # The workshop's config itself: local when asked, and the hub's log says so.
    monkeypatch.setenv("SLOTMAP_HUB_SPAWNER", "local")
    (tmp_path / "hub").mkdir()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="JupyterHub"):
        hub = _load_hub_config(tmp_path / "hub", monkeypatch)
    assert hub.JupyterHub.spawner_class == "localprocess"
    assert "Per-learner memory and CPU limits are OFF: SLOTMAP_HUB_SPAWNER=local" in (
        caplog.messages
    )


def test_the_default_memory_holds_a_learners_measured_peak_without_culling(tmp_path):
    default = limits.read({}, tmp_path)
    peak = limits.LEARNER_UNCULLED_GB * 1e9
    assert peak <= default.memory_bytes <= peak + 1024**3
    assert default.cpu == 2 and default.cpu_quota == "200%"


@pytest.mark.parametrize(
    ("environ", "reason"),
    [
        ({"SLOTMAP_HUB_MEM_LIMIT": "lots"}, "'lots': not a size like 3G or 2500M"),
        ({"SLOTMAP_HUB_MEM_LIMIT": "3"}, "'3': not a size like 3G or 2500M"),
        ({"SLOTMAP_HUB_MEM_LIMIT": "500M"}, "'500M': below 0.6 GB, what a learner's"),
        ({"SLOTMAP_HUB_CPU_LIMIT": "two"}, "'two': not a number of cores like 2 or 0.5"),
        ({"SLOTMAP_HUB_CPU_LIMIT": "0"}, "'0': not a number of cores like 2 or 0.5"),
        ({"SLOTMAP_HUB_CPU_LIMIT": "nan"}, "'nan': not a number of cores like 2 or 0.5"),
        ({"SLOTMAP_HUB_SPAWNER": "docker"}, "'docker': not systemd, local or unset"),
        ({"SLOTMAP_HUB_SPAWNER": "systemd"}, "=systemd, but systemd is not this machine's init"),
    ],
)
def test_bad_values_are_refused_with_a_one_line_reason(environ, reason, tmp_path, capsys):
    with pytest.raises(ValueError) as refused:
        limits.read(environ, tmp_path / "no-systemd")
    message = str(refused.value)
    assert reason in message and message.startswith(next(iter(environ))) and "\n" not in message
    ok, line = preflight.limits_line(environ, tmp_path / "no-systemd")
    assert not ok and line == f"limits       FAIL: {message}"


def test_the_hub_and_the_preflight_refuse_a_bad_limit(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SLOTMAP_HUB_CPU_LIMIT", "lots")
    with pytest.raises(SystemExit) as refused:
        _load_hub_config(tmp_path, monkeypatch)
    assert (
        str(refused.value) == "SLOTMAP_HUB_CPU_LIMIT='lots': not a number of cores like 2 or 0.5"
    )

    monkeypatch.setattr(preflight, "hub_pieces", lambda: [])
    monkeypatch.setattr(preflight, "available_gb", lambda: 100.0)
    monkeypatch.setattr(preflight, "python_line", lambda: (True, "python       OK"))
    monkeypatch.setattr(preflight, "trial_learner", lambda: "")
    done = SimpleNamespace(returncode=0, stdout="all passed\n", stderr="")
    monkeypatch.setattr(preflight.subprocess, "run", lambda *a, **k: done)
    assert preflight.preflight(10) == 1
    out = capsys.readouterr().out
    assert f"limits       FAIL: {refused.value}\n" in out and "preflight: NOT ready" in out
    monkeypatch.delenv("SLOTMAP_HUB_CPU_LIMIT")
    assert preflight.preflight(10) == 0
    assert "\nlimits       O" in capsys.readouterr().out  # OK or OFF, by this machine's init
