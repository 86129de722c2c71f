"""The hub's ports, and its proxy as a process of its own.

JupyterHub starts configurable-http-proxy itself by default, and a hub restart then takes the
proxy down with it: every learner's page is unreachable until the new hub has started its
proxy and restored the routes. Run apart (``slotmap workshop proxy``, the
``slotmap-proxy.service`` unit), the proxy keeps its routes in memory while the hub restarts,
so learners keep working in their servers; only the hub's own pages (login, admin) wait.
The hub's config (``SLOTMAP_HUB_PROXY=external``) and the proxy take their ports from the
same environment variables through ``Ports``, and share ``CONFIGPROXY_AUTH_TOKEN``.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

# Set in the hub's environment when the proxy runs apart (slotmap-hub.service sets it).
EXTERNAL_VARIABLE = "SLOTMAP_HUB_PROXY"
TOKEN_VARIABLE = "CONFIGPROXY_AUTH_TOKEN"


@dataclass(frozen=True)
class Ports:
    """Where the hub's pieces listen: ``ip``:``public`` is what learners open; the hub's API,
    the proxy's API and the dashboard listen on loopback."""

    ip: str
    public: int
    hub_api: int
    proxy_api: int
    dashboard: int

    @classmethod
    def from_environment(cls, environ: dict[str, str] | None = None) -> Ports:
        env = os.environ if environ is None else environ

        def port(variable: str, default: int) -> int:
            return int(env.get(variable) or default)

        return cls(
            ip=env.get("SLOTMAP_HUB_IP", ""),
            public=port("SLOTMAP_HUB_PORT", 8000),
            hub_api=port("SLOTMAP_HUB_API_PORT", 8081),
            proxy_api=port("SLOTMAP_HUB_PROXY_API_PORT", 8001),
            dashboard=port("SLOTMAP_HUB_DASHBOARD_PORT", 8002),
        )


def external(environ: dict[str, str] | None = None) -> bool:
    """Whether the hub must leave its proxy to ``slotmap workshop proxy``."""
    env = os.environ if environ is None else environ
    return env.get(EXTERNAL_VARIABLE, "") == "external"


def proxy_executable() -> str | None:
    """configurable-http-proxy: the one ``make hub`` installs into the environment, else the
    one on PATH, else None."""
    local = Path(sys.prefix) / "hub-proxy" / "node_modules" / ".bin" / "configurable-http-proxy"
    return str(local) if local.exists() else shutil.which("configurable-http-proxy")


def proxy_command(ports: Ports, executable: str) -> list[str]:
    """The command line JupyterHub would start its proxy with, for these ports."""
    return [
        executable,
        "--ip",
        ports.ip,
        "--port",
        str(ports.public),
        "--api-ip",
        "127.0.0.1",
        "--api-port",
        str(ports.proxy_api),
        "--error-target",
        f"http://127.0.0.1:{ports.hub_api}/hub/error",
        "--log-level",
        "info",
    ]


def run_proxy(environ: dict[str, str] | None = None) -> int:
    """``slotmap workshop proxy``: become configurable-http-proxy (systemd then tracks the
    proxy itself). Returns an exit code only when it cannot start."""
    env = dict(os.environ if environ is None else environ)
    if len(env.get(TOKEN_VARIABLE, "")) < 32:
        print(
            f"slotmap workshop proxy: set {TOKEN_VARIABLE} to a secret of 32+ characters, the "
            "same in the hub's environment (openssl rand -hex 32)",
            file=sys.stderr,
        )
        return 2
    executable = proxy_executable()
    if executable is None:
        print(
            "slotmap workshop proxy: configurable-http-proxy is not installed (make hub)",
            file=sys.stderr,
        )
        return 2
    command = proxy_command(Ports.from_environment(env), executable)
    os.execve(command[0], command, env)
    return 0  # not reached: execve replaced this process
