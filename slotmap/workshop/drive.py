"""Drive a workshop hub as its learners do, without a browser: log in with the room's password,
start a server, run notebook cells in a kernel and move a widget's slider through the
kernel's own protocol (the Jupyter server's REST API and its kernel websocket).

The end-to-end hub test (tests/test_workshop_hub.py) and the load script
(benchmarks/workshop_load.py) use it; it needs ``requests`` (JupyterHub's) and
``websocket-client`` (Jupyter server's).
"""

from __future__ import annotations

import html
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slotmap.exercises.core import CHECK_MIME
from slotmap.workshop import proxy


class HubError(RuntimeError):
    """The hub or a learner's server did not do what was asked; the message says what."""


def _xsrf(session: Any, page_url: str, timeout: float) -> str:
    """The xsrf token a hub page hands its own forms and scripts (the cookie holds it in
    another encoding, tied to the browser's session)."""
    page = session.get(page_url, timeout=timeout)
    page.raise_for_status()
    found = re.search(r'(?:name="_xsrf"\s+value=|xsrf_token:\s*)"([^"]+)"', page.text)
    if not found:
        raise HubError(f"no xsrf token in {page_url}")
    return html.unescape(found.group(1))


def login(hub: str, name: str, password: str, timeout: float = 30) -> Any:
    """A ``requests`` session logged in to the hub as ``name`` (through its login form)."""
    import requests

    session = requests.Session()
    xsrf = _xsrf(session, f"{hub}/hub/login", timeout)
    response = session.post(
        f"{hub}/hub/login",
        data={"username": name, "password": password, "_xsrf": xsrf},
        allow_redirects=False,
        timeout=timeout,
    )
    if response.status_code != 302:
        raise HubError(
            f"login as {name} answered {response.status_code}, not a redirect: "
            f"{login_error(response.text)}"
        )
    return session


def login_error(page: str) -> str:
    """The message the hub's login page shows (its error box), or ""."""
    found = re.search(r'class="login_error"[^>]*>(.*?)</p>', page, re.S)
    return html.unescape(re.sub(r"<[^>]+>", "", found.group(1))).strip() if found else ""


def refused_login(hub: str, name: str, password: str, timeout: float = 30) -> tuple[int, str]:
    """Try to log in as ``name``, expecting a refusal: the status and the page's message.
    Raises ``HubError`` if the hub lets ``name`` in."""
    try:
        login(hub, name, password, timeout)
    except HubError as error:
        found = re.match(r"login as .* answered (\d+), not a redirect: (.*)", str(error), re.S)
        if found:
            return int(found.group(1)), found.group(2)
        raise
    raise HubError(f"the hub let {name} in")


def api_token(hub: str, session: Any, name: str, timeout: float = 30) -> str:
    """A new API token of the logged-in user (the hub's own token API, as its token page)."""
    response = session.post(
        f"{hub}/hub/api/users/{name}/tokens",
        json={"note": "slotmap workshop", "expires_in": 4 * 3600},
        headers={"X-XSRFToken": _xsrf(session, f"{hub}/hub/token", timeout)},
        timeout=timeout,
    )
    if response.status_code != 201:
        raise HubError(f"token for {name}: {response.status_code} {response.text[:200]}")
    return response.json()["token"]


def hub_api(hub: str, token: str, method: str, path: str, timeout: float = 30, **kw) -> Any:
    """One request to the hub's REST API with ``token``; returns the ``requests`` response."""
    import requests

    headers = {"Authorization": f"token {token}"}
    return requests.request(method, f"{hub}/hub/api{path}", headers=headers, timeout=timeout, **kw)


def start_server(hub: str, token: str, name: str, timeout: float = 180) -> float:
    """Ask the hub for ``name``'s server and wait until it is ready; returns the seconds."""
    started = time.monotonic()
    response = hub_api(hub, token, "POST", f"/users/{name}/server")
    if response.status_code not in (201, 202, 400):  # 400: already running
        raise HubError(f"start {name}: {response.status_code} {response.text[:200]}")
    while True:
        model = hub_api(hub, token, "GET", f"/users/{name}").json()
        server = (model.get("servers") or {}).get("")
        if server and server.get("ready"):
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise HubError(f"{name}'s server not ready after {timeout} s: {server}")
        time.sleep(0.5)


def wait_stopped(hub: str, token: str, name: str, timeout: float = 120) -> None:
    """Wait until the hub says ``name`` has no server (after a stop was asked)."""
    started = time.monotonic()
    while (hub_api(hub, token, "GET", f"/users/{name}").json().get("servers") or {}).get(""):
        if time.monotonic() - started > timeout:
            raise HubError(f"{name}'s server still there after {timeout} s")
        time.sleep(0.5)


@dataclass
class Execution:
    """What one request to the kernel produced, and how long until the kernel was idle."""

    outputs: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""
    seconds: float = 0.0
    comm_opens: list[dict[str, Any]] = field(default_factory=list)

    def checks(self) -> dict[str, bool]:
        """What the check cells reported (``slotmap.exercises.check``'s record)."""
        return {
            output["data"][CHECK_MIME]["exercise"]: output["data"][CHECK_MIME]["passed"]
            for output in self.outputs
            if CHECK_MIME in output.get("data", {})
        }


class Kernel:
    """A kernel of a learner's server, reached through its websocket (the protocol a browser
    speaks), for notebook ``path``."""

    def __init__(self, server: str, token: str, path: str, timeout: float = 120):
        import requests
        import websocket

        self.server, self.token = server.rstrip("/"), token
        self.headers = {"Authorization": f"token {token}"}
        body = {"path": path, "name": path.rsplit("/", 1)[-1], "type": "notebook"}
        body["kernel"] = {"name": "python3"}
        response = requests.post(
            f"{self.server}/api/sessions", json=body, headers=self.headers, timeout=timeout
        )
        if response.status_code != 201:
            raise HubError(f"session for {path}: {response.status_code} {response.text[:200]}")
        self.session_id = response.json()["id"]
        self.kernel_id = response.json()["kernel"]["id"]
        self.client_session = uuid.uuid4().hex
        url = self.server.replace("http", "ws", 1)
        url += f"/api/kernels/{self.kernel_id}/channels?session_id={self.client_session}"
        self.socket = websocket.create_connection(
            url, header=[f"Authorization: token {token}"], timeout=timeout
        )
        self.widgets: dict[str, dict[str, Any]] = {}  # comm id -> the widget model's state

    def _send(self, msg_type: str, content: dict[str, Any], channel: str = "shell") -> str:
        msg_id = uuid.uuid4().hex
        header = {"msg_id": msg_id, "msg_type": msg_type, "username": "learner", "version": "5.3"}
        header.update(session=self.client_session, date="")
        message = {"header": header, "parent_header": {}, "metadata": {}, "content": content}
        message.update(channel=channel, buffers=[])
        self.socket.send(json.dumps(message))
        return msg_id

    def _wait_idle(self, msg_id: str, timeout: float) -> Execution:
        """Collect iopub messages answering ``msg_id`` until the kernel is idle again."""
        result, started = Execution(), time.monotonic()
        while True:
            remaining = timeout - (time.monotonic() - started)
            if remaining <= 0:
                raise HubError(f"the kernel did not finish within {timeout} s")
            self.socket.settimeout(remaining)
            message = json.loads(self.socket.recv())
            kind, content = message.get("msg_type"), message.get("content", {})
            if kind == "comm_open" and content.get("target_name") == "jupyter.widget":
                self.widgets[content["comm_id"]] = content.get("data", {}).get("state", {})
                result.comm_opens.append(content)
            if message.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if kind in ("stream", "display_data", "execute_result"):
                result.outputs.append(content)
            elif kind == "error":
                result.error = f"{content.get('ename')}: {content.get('evalue')}"
            elif kind == "status" and content.get("execution_state") == "idle":
                result.seconds = time.monotonic() - started
                return result

    def execute(self, code: str, timeout: float = 300) -> Execution:
        """Run ``code`` as a cell and wait for the kernel to be idle."""
        msg_id = self._send(
            "execute_request",
            {
                "code": code,
                "silent": False,
                "store_history": True,
                "user_expressions": {},
                "allow_stdin": False,
                "stop_on_error": True,
            },
        )
        return self._wait_idle(msg_id, timeout)

    def slider(self, description: str) -> str:
        """The comm id of the slider widget labelled ``description`` (opened by a cell)."""
        for comm_id, state in self.widgets.items():
            if state.get("_model_name") == "IntSliderModel" and state.get("description") == (
                description
            ):
                return comm_id
        raise HubError(f"no slider '{description}' among {len(self.widgets)} widgets")

    def set_widget(self, comm_id: str, timeout: float = 120, **state: Any) -> Execution:
        """Change a widget's state as a browser does (a comm ``update``) and wait until the
        kernel has handled it (its observers, the figure redrawn, have run)."""
        msg_id = self._send(
            "comm_msg",
            {"comm_id": comm_id, "data": {"method": "update", "state": state, "buffer_paths": []}},
        )
        return self._wait_idle(msg_id, timeout)

    def close(self) -> None:
        """Close the socket and delete the session (which shuts its kernel down)."""
        import requests

        try:
            self.socket.close()
        finally:
            requests.delete(
                f"{self.server}/api/sessions/{self.session_id}", headers=self.headers, timeout=30
            )


def code_cells(notebook: dict[str, Any]) -> list[str]:
    """The sources of a notebook's code cells, in order."""
    return [
        "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        for cell in notebook["cells"]
        if cell["cell_type"] == "code"
    ]


def solved_cells(course: Path, name: str = "01_paged_kv_cache.ipynb") -> dict[int, str]:
    """Code-cell index of the exercise ``name`` -> the cell as a learner fills it: the
    solution's code in each stub's cell (the solution's ``###`` markers left out)."""
    exercise = json.loads((course / "exercises" / name).read_text(encoding="utf-8"))
    solution = json.loads((course / "solutions" / name).read_text(encoding="utf-8"))
    solved = {cell["id"]: "".join(cell["source"]) for cell in solution["cells"]}
    answers = {}
    for index, cell in enumerate(exercise["cells"]):
        if cell["cell_type"] == "code" and "# YOUR CODE HERE" in "".join(cell["source"]):
            lines = solved[cell["id"]].splitlines()
            answers[index] = "\n".join(line for line in lines if "### " not in line)
    return answers


def run_exercise(
    server: str, token: str, answers: dict[int, str], path: str = "my_work/01_paged_kv_cache.ipynb"
) -> tuple[dict[str, bool], str]:
    """Fill the learner's exercise ``path`` with ``answers`` (code-cell index -> source) and
    run its code cells in a kernel of theirs, as a learner does: what its checks reported,
    and the first error ("" if none; the run stops there)."""
    notebook = get_notebook(server, token, path)
    for index, answer in answers.items():
        notebook["cells"][index]["source"] = answer
    kernel = Kernel(server, token, path)
    checks: dict[str, bool] = {}
    try:
        for code in code_cells(notebook):
            run = kernel.execute(code)
            if run.error:
                return checks, run.error
            checks.update(run.checks())
    finally:
        kernel.close()
    return checks, ""


def get_notebook(server: str, token: str, path: str, timeout: float = 30) -> dict[str, Any]:
    """A notebook of the learner's server, through the contents API."""
    import requests

    quoted = urllib.parse.quote(path)
    response = requests.get(
        f"{server}/api/contents/{quoted}",
        headers={"Authorization": f"token {token}"},
        timeout=timeout,
    )
    if response.status_code != 200:
        raise HubError(f"{path}: {response.status_code} {response.text[:200]}")
    return response.json()["content"]


def free_port() -> int:
    """A TCP port free on loopback just now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name (field 2) may hold spaces: the parent pid follows its ')'.
        children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


class LocalHub:
    """JupyterHub with ``workshop/jupyterhub_config.py`` on 127.0.0.1: for tests, the load
    script and the pre-flight. As root, learners are the system users the hub creates (as in
    a room; ``remove_learners`` deletes them); otherwise every learner's home is under
    ``base/homes`` and they run as this user (the config's SimpleLocalProcessSpawner mode).
    ``stop`` stops it and every process it started; ``leftovers`` lists any that is still
    alive (a kernel runs in a session of its own: found by this hub's folder or its uid).
    ``external_proxy``: the proxy runs apart (``slotmap workshop proxy``, as
    slotmap-proxy.service runs it) and outlives ``restart``."""

    def __init__(
        self,
        base: Path | str,
        password: str,
        admin_password: str,
        system_users: bool | None = None,
        external_proxy: bool = False,
    ):
        self.base = Path(base)
        self.homes = self.base / "homes"
        self.state = self.base / "state"
        self.system_users = os.geteuid() == 0 if system_users is None else system_users
        self.password, self.admin_password = password, admin_password
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = self.base / "hub.log"
        self.process: Any = None
        self.external_proxy = external_proxy
        self.proxy: Any = None
        self.seen: set[int] = set()
        self.env: dict[str, str] = {}

    def home(self, name: str) -> Path:
        """``name``'s home (their system user's, or under ``base/homes``)."""
        if self.system_users:
            import pwd

            return Path(pwd.getpwnam(name).pw_dir)
        return self.homes / name

    def learners(self) -> dict[str, int]:
        """The accounts this hub created (name -> uid), from its record."""
        from slotmap.workshop.accounts import REGISTRY_FILE, Registry

        return Registry(self.state / REGISTRY_FILE).created()

    def _environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            SLOTMAP_HUB_IP="127.0.0.1",
            SLOTMAP_HUB_PORT=str(self.port),
            SLOTMAP_HUB_API_PORT=str(free_port()),
            SLOTMAP_HUB_PROXY_API_PORT=str(free_port()),
            SLOTMAP_HUB_DASHBOARD_PORT=str(free_port()),
            SLOTMAP_HUB_STATE=str(self.state),
            SLOTMAP_HUB_ADMINS="instructor",  # whoever the room's instructors are
            SLOTMAP_HUB_PASSWORD=self.password,
            SLOTMAP_HUB_ADMIN_PASSWORD=self.admin_password,
            SLOTMAP_BACKEND=os.environ.get("SLOTMAP_BACKEND", "cpu"),
        )
        env.pop("SLOTMAP_HUB_HOMES", None)
        env.pop(proxy.EXTERNAL_VARIABLE, None)
        if self.external_proxy:
            env[proxy.EXTERNAL_VARIABLE] = "external"
            env[proxy.TOKEN_VARIABLE] = uuid.uuid4().hex + uuid.uuid4().hex
        if not self.system_users:
            env["SLOTMAP_HUB_HOMES"] = str(self.homes / "{username}")
        return env

    def start(self, config: Path | str, timeout: float = 120) -> None:
        """Start ``jupyterhub -f config`` and wait until its API answers (again on the same
        ports and state after ``restart``)."""

        import requests

        self.config = config
        env = self.env = self.env or self._environment()
        executable = proxy.proxy_executable()
        if executable:
            env["PATH"] = f"{Path(executable).parent}{os.pathsep}{env.get('PATH', '')}"
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        if self.external_proxy and self.proxy is None:
            self.proxy = subprocess.Popen(
                [sys.executable, "-m", "slotmap", "workshop", "proxy"],
                cwd=self.base,
                env=env,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.process = subprocess.Popen(
            [str(Path(sys.executable).with_name("jupyterhub")), "-f", str(config)],
            cwd=self.base,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while True:
            try:
                if requests.get(f"{self.url}/hub/api/", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            if self.process.poll() is not None:
                raise HubError(f"jupyterhub exited:\n{self.log_tail()}")
            if self.proxy is not None and self.proxy.poll() is not None:
                raise HubError(f"the proxy exited:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise HubError(f"jupyterhub not ready after {timeout} s:\n{self.log_tail()}")
            time.sleep(0.5)

    def restart(self, timeout: float = 120, while_down: Any = None) -> None:
        """Stop the hub process alone (SIGTERM, as ``systemctl restart`` does), call
        ``while_down()`` if given, then start it again: the learners' servers (and an external
        proxy) are left running."""
        self.remember_processes()
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=120)
        self._log.close()
        if while_down is not None:
            while_down()
        self.start(self.config, timeout)

    def remember_processes(self) -> None:
        """Note the hub's processes now (servers and kernels come and go)."""
        if self.process is not None and self.process.poll() is None:
            self.seen.update(descendants(self.process.pid))

    def log_tail(self, chars: int = 6000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGTERM (the hub stops its services and its own proxy), then make sure: terminate
        and kill whatever of its processes is left, and the external proxy."""

        process = self.process
        if process is None:
            return
        self.remember_processes()
        self.seen.update(self._marked())
        self.seen.update(self._of_learners())
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in [p for p in self.seen if Path(f"/proc/{p}").exists()]:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            if process.poll() is None:
                try:
                    os.killpg(process.pid, sig)
                except ProcessLookupError:
                    pass
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                continue
            time.sleep(0.5)
        if self.proxy is not None:
            self.proxy.terminate()
            try:
                self.proxy.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proxy.kill()
                self.proxy.wait()
            self.proxy = None
        self._log.close()
        self.process = None

    def _marked(self) -> list[int]:
        """Live processes with this hub's folder in their command line or environment."""

        marker = str(self.base).encode()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes()
                environ = (entry / "environ").read_bytes()
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state != "Z" and (marker in cmdline or marker in environ):
                found.append(int(entry.name))
        return found

    def _of_learners(self) -> list[int]:
        """Live processes of the system users this hub created."""
        uids = set(self.learners().values()) if self.system_users else set()
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and uids:
                try:
                    if entry.stat().st_uid in uids:
                        found.append(int(entry.name))
                except OSError:
                    continue
        return found

    def remove_learners(self) -> list[str]:
        """Kill every process of the system users this hub created and delete them with
        their homes (after ``stop``); returns their names."""
        from slotmap.exercises.sandbox import kill_uid

        names = sorted(self.learners()) if self.system_users else []
        for name, uid in self.learners().items() if self.system_users else ():
            kill_uid(uid)
            subprocess.run(["userdel", "--remove", name], capture_output=True, check=False)
        return names

    def leftovers(self) -> list[str]:
        """The hub's processes still alive: its own, and any with its folder in their command
        line or environment; as 'pid: command'."""

        alive = {p for p in self.seen if Path(f"/proc/{p}").exists()} | set(self._marked())
        alive |= set(self._of_learners())
        left = []
        for pid in sorted(alive):
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
                if stat.rsplit(")", 1)[1].split()[0] == "Z":
                    continue
                command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            left.append(f"{pid}: {command[:200]!r}")
        return left

    def processes_of(self, name: str) -> list[int]:
        """The live processes running with ``name``'s home (their server and kernels)."""

        marker = f"HOME={self.home(name)}\0".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if marker in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
        return found
