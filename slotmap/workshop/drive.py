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
import re
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field
from typing import Any

CHECK_MIME = "application/vnd.slotmap.check+json"


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
        raise HubError(f"login as {name} answered {response.status_code}, not a redirect")
    return session


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


def stop_server(hub: str, token: str, name: str, timeout: float = 60) -> None:
    """Stop ``name``'s server and wait until the hub says it is gone."""
    hub_api(hub, token, "DELETE", f"/users/{name}/server")
    deadline = time.monotonic() + timeout
    while (hub_api(hub, token, "GET", f"/users/{name}").json().get("servers") or {}).get(""):
        if time.monotonic() > deadline:
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

    def text(self) -> str:
        parts = []
        for output in self.outputs:
            parts.append(output.get("text", "") or output.get("data", {}).get("text/plain", ""))
        return "".join(parts)


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
