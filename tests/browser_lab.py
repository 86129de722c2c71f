"""The course's JupyterLab, started the way ``make lab`` starts it, and a headless Chromium that
opens it: the machinery behind ``test_browser.py``.

* ``LabServer`` copies the course into a temporary folder and runs ``slotmap lab`` there (the
  command ``make lab`` runs) on loopback, with a token, and with Jupyter's config, data,
  runtime and settings folders of its own, so that it never reads a learner's settings nor
  writes into the checkout. ``stop`` shuts it down through the API, then terminates and kills
  its process group and every process it started (kernels run in sessions of their own).
* ``chromium_path``: Debian's ``chromium``; ``launch_chromium`` drives it with Playwright,
  whose own browser downloads are never used (``playwright install`` is not run anywhere).
* ``NotebookPage``: what the test does to a notebook, as a learner does it: open it, wait for
  its kernel, run all cells from the menu, type into a cell, move a slider; and what it reads
  back, from the page (rendered outputs) and from JupyterLab's model (execution counts,
  error outputs).
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from slotmap.exercises.core import CHECK_MIME
from slotmap.workshop.drive import descendants, free_port

ROOT = Path(__file__).resolve().parents[1]
# Flags for Chromium on a closed network, as root (see the browser recipe): without the
# background-networking ones Chromium keeps trying Google's hosts.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


def chromium_path() -> str | None:
    """Debian's chromium (``CHROMIUM_PATH`` overrides), or None when it is not installed."""
    configured = os.environ.get("CHROMIUM_PATH")
    if configured:
        return configured if os.path.exists(configured) else None
    return shutil.which("chromium") or shutil.which("chromium-browser")


def artifacts_dir() -> Path:
    """Where screenshots and the server's log go: ``$SLOTMAP_BROWSER_ARTIFACTS`` or
    ``tests/artifacts/`` (git-ignored)."""
    folder = Path(os.environ.get("SLOTMAP_BROWSER_ARTIFACTS") or ROOT / "tests" / "artifacts")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


class LabServer:
    """``slotmap lab`` on a temporary copy of the course (see the module docstring)."""

    def __init__(self, base: Path, lang: str = "en"):
        self.base = base
        self.lang = lang  # slotmap lab --lang: the lessons, exercises and menus in it
        self.course = base / "course"
        self.token = "slotmap-test-" + os.urandom(8).hex()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = base / "lab.log"
        self.process: subprocess.Popen | None = None

    def _prepare(self) -> dict[str, str]:
        for folder in ("notebooks", "exercises", "solutions"):
            shutil.copytree(ROOT / folder, self.course / folder)
        shutil.copy(ROOT / ".slotmap-course", self.course)  # what makes the copy the course
        jupyter = self.base / "jupyter"
        env = dict(os.environ)
        env.update(
            JUPYTER_CONFIG_DIR=str(jupyter / "config"),
            JUPYTER_DATA_DIR=str(jupyter / "data"),
            JUPYTER_RUNTIME_DIR=str(jupyter / "runtime"),
            IPYTHONDIR=str(jupyter / "ipython"),
            JUPYTERLAB_SETTINGS_DIR=str(jupyter / "lab-settings"),
            JUPYTERLAB_WORKSPACES_DIR=str(jupyter / "lab-workspaces"),
            JUPYTER_PLATFORM_DIRS="1",
            SLOTMAP_BACKEND=os.environ.get("SLOTMAP_BACKEND", "cpu"),
        )
        env.pop("JUPYTER_PATH", None)
        # No "get Jupyter news?" toast over the notebook (the learner's first start shows one).
        notification = jupyter / "lab-settings" / "@jupyterlab" / "apputils-extension"
        notification.mkdir(parents=True)
        (notification / "notification.jupyterlab-settings").write_text(
            json.dumps({"fetchNews": "false", "checkForUpdates": False})
        )
        return env

    def command(self) -> list[str]:
        """``slotmap lab`` as ``make lab`` runs it, plus what a test needs: a fixed port and
        token, no browser of its own, the app exposed to the page's scripts (to read kernel
        state and outputs) and no update checks."""
        script = Path(sys.executable).with_name("slotmap")
        launcher = [str(script)] if script.exists() else [sys.executable, "-m", "slotmap"]
        return launcher + [
            "lab",
            "--lang",
            self.lang,
            "--no-browser",
            "--ip",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--token",
            self.token,
            "--LabApp.expose_app_in_browser=True",
            "--LabApp.news_url=None",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        ]

    def start(self, timeout: float = 90) -> None:
        env = self._prepare()
        log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self._log = log
        self.process = subprocess.Popen(
            self.command(),
            cwd=self.course,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stop() kills all of it
        )
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.api("GET", "/api/status", timeout=2)
                return
            except OSError:
                if self.process.poll() is not None:
                    raise RuntimeError(f"slotmap lab exited:\n{self.log_tail()}") from None
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"slotmap lab not ready after {timeout} s:\n{self.log_tail()}"
                    ) from None
                time.sleep(0.25)

    def api(self, method: str, path: str, timeout: float = 10) -> bytes:
        request = urllib.request.Request(
            f"{self.url}{path}", method=method, headers={"Authorization": f"token {self.token}"}
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.read()

    def shutdown_kernels(self) -> None:
        """End every kernel session (closing a tab leaves its kernel running)."""
        try:
            for session in json.loads(self.api("GET", "/api/sessions")):
                self.api("DELETE", f"/api/sessions/{session['id']}")
        except OSError:
            pass

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        """Shut down through the API (which stops the kernels), then make sure: terminate and
        kill the process group and every descendant (a kernel runs in its own session)."""
        process = self.process
        if process is None:
            return
        kernels = descendants(process.pid) if process.poll() is None else []
        try:
            if process.poll() is None:
                self.api("POST", "/api/shutdown", timeout=5)
                process.wait(timeout=15)
        except Exception:  # noqa: BLE001 - fall through to the signals
            pass
        for sig in (signal.SIGTERM, signal.SIGKILL):
            alive = [pid for pid in kernels if Path(f"/proc/{pid}").exists()]
            if process.poll() is None:
                try:
                    os.killpg(process.pid, sig)
                except ProcessLookupError:
                    pass
            for pid in alive:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                continue
            if not [pid for pid in kernels if Path(f"/proc/{pid}").exists()]:
                break
            time.sleep(1)
        self._log.close()
        self.process = None


def launch_chromium(playwright, profile: Path, viewport: tuple[int, int]):
    """A persistent context in Debian's chromium (Playwright refuses ``--user-data-dir`` in
    ``args``; a persistent context gets a fresh profile folder instead)."""
    return playwright.chromium.launch_persistent_context(
        str(profile),
        executable_path=chromium_path(),
        headless=True,
        args=CHROMIUM_ARGS,
        viewport={"width": viewport[0], "height": viewport[1]},
    )


@contextlib.contextmanager
def chromium_context(
    profile: Path, viewport: tuple[int, int], timeout_ms: int, missing: Callable[[str], None]
) -> Iterator[Any]:
    """A persistent chromium context for a test module, closed after it; ``missing(reason)``
    (a skip, or a failure under CI) when chromium or playwright is not installed."""
    if chromium_path() is None:
        missing("Debian's chromium is not installed (apt-get install chromium; make test does)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing("the playwright package is not installed (pip install -e '.[test]')")
    with sync_playwright() as playwright:
        context = launch_chromium(playwright, profile, viewport)
        try:
            context.set_default_timeout(timeout_ms)
            yield context
        finally:
            context.close()


def png_pixels(src: str) -> tuple[tuple[int, int], bytes]:
    """(size, RGB bytes) of a ``data:image/png;base64,...`` image."""
    from PIL import Image

    assert src.startswith("data:image/png;base64,"), src[:60]
    image = Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1]))).convert("RGB")
    return image.size, image.tobytes()


# JupyterLab's state, read through window.jupyterapp (--LabApp.expose_app_in_browser). The
# execution indicator in the DOM says "idle" before a kernel even exists: ask the kernel.
_PANEL = """const app = window.jupyterapp;
  const w = app && app.shell.currentWidget;
  if (!w || !w.context || w.context.path !== path) return null;
  if (!w.content || !w.content.model) return null;"""
KERNEL_IDLE = f"""(path) => {{ {_PANEL}
  const k = w.sessionContext.session && w.sessionContext.session.kernel;
  return !!k && k.status === 'idle' && k.connectionStatus === 'connected'; }}"""
MAX_EXECUTION_COUNT = f"""(path) => {{ {_PANEL}
  let top = 0; const cells = w.content.model.cells;
  for (let i = 0; i < cells.length; i++) {{
    const c = cells.get(i);
    if (c.type === 'code' && c.executionCount) top = Math.max(top, c.executionCount);
  }}
  return top; }}"""
# Every code cell ran after ``since`` (its execution count is above it), and the kernel is idle.
ALL_RAN = f"""([path, since]) => {{ {_PANEL}
  const k = w.sessionContext.session && w.sessionContext.session.kernel;
  if (!k || k.status !== 'idle') return false;
  const cells = w.content.model.cells;
  for (let i = 0; i < cells.length; i++) {{
    const c = cells.get(i);
    if (c.type === 'code' && !(c.executionCount > since)) return false;
  }}
  return true; }}"""
# Each code cell's outputs as nbformat JSON.
OUTPUTS = f"""(path) => {{ {_PANEL}
  const out = []; const cells = w.content.model.cells;
  for (let i = 0; i < cells.length; i++) {{
    const c = cells.get(i); out.push(c.type === 'code' ? c.outputs.toJSON() : null);
  }}
  return out; }}"""
SOURCE = f"""([path, index]) => {{ {_PANEL}
  return w.content.model.cells.get(index).sharedModel.getSource(); }}"""
DIRTY = f"""(path) => {{ {_PANEL} return w.context.model.dirty; }}"""
# A figure inside a widget's Output: present, decoded, and not the one it was (``old``).
NEW_FIGURE = """([view, old]) => { const img = view.querySelector('.widget-output img');
  return !!img && img.complete && img.naturalWidth > 0 && img.getAttribute('src') !== old; }"""
IMAGES_DECODED = """(nodes) => nodes.every((img) => img.complete && img.naturalWidth > 0)"""


# The Run menu's name in JupyterLab's interface, by the language slotmap lab gives it.
RUN_MENU = {"en": "Run", "zh": "运行"}


class NotebookPage:
    """One notebook open in JupyterLab, driven the way a learner drives it."""

    def __init__(self, page, server: LabServer, path: str):
        self.page, self.server, self.path = page, server, path

    def open(self) -> None:
        """Open the notebook in a fresh workspace (``reset``: no tabs restored from an earlier
        page, whose kernels would start too) and wait for its kernel."""
        self.page.goto(f"{self.server.url}/lab/tree/{self.path}?reset&token={self.server.token}")
        self.page.wait_for_function(KERNEL_IDLE, arg=self.path, timeout=90_000)
        panel_id = self.page.evaluate("() => window.jupyterapp.shell.currentWidget.id")
        self.panel = self.page.locator(f'[id="{panel_id}"]')

    def run_all(self, timeout_ms: int) -> None:
        """Run > Run All Cells, then wait until every code cell has run and the kernel idles."""
        since = self.page.evaluate(MAX_EXECUTION_COUNT, self.path)
        self.page.locator("#jp-menu-panel, .jp-MenuBar").first.wait_for()
        self.page.get_by_role(
            "menuitem", name=RUN_MENU[getattr(self.server, "lang", "en")], exact=True
        ).click()
        self.page.locator("li.lm-Menu-item[data-command='runmenu:run-all']").click()
        self.page.wait_for_function(ALL_RAN, arg=[self.path, since], timeout=timeout_ms)

    def outputs(self) -> list[list[dict] | None]:
        return self.page.evaluate(OUTPUTS, self.path)

    def error_outputs(self) -> list[str]:
        """Error outputs (a Python traceback in a cell), as 'cell N: Name: value'."""
        found = []
        for index, outputs in enumerate(self.outputs()):
            for output in outputs or []:
                if output.get("output_type") == "error":
                    found.append(f"cell {index}: {output.get('ename')}: {output.get('evalue')}")
        return found

    def check_records(self) -> dict[str, bool]:
        """What the notebook's check cells reported (``slotmap.exercises.check``)."""
        records = {}
        for outputs in self.outputs():
            for output in outputs or []:
                record = output.get("data", {}).get(CHECK_MIME)
                if record:
                    records[record["exercise"]] = record["passed"]
        return records

    def is_dirty(self) -> bool:
        return bool(self.page.evaluate(DIRTY, self.path))

    def reports(self, text: str):
        """Check reports (and other preformatted outputs) that show ``text``."""
        return self.panel.locator(".jp-OutputArea-output pre", has_text=text)

    def cell(self, index: int):
        return self.panel.locator(".jp-Notebook .jp-Cell").nth(index)

    def source(self, index: int) -> str:
        return self.page.evaluate(SOURCE, [self.path, index])

    def replace_source(self, index: int, text: str) -> None:
        """Click into the cell's editor, select everything and paste ``text`` over it (pasted,
        not typed key by key: the editor would auto-indent and close brackets)."""
        cell = self.cell(index)
        cell.scroll_into_view_if_needed()
        cell.locator(".cm-content").click()
        self.page.keyboard.press("Control+a")
        self.page.keyboard.insert_text(text)
        self.page.keyboard.press("Escape")  # back to command mode, as after editing

    def widget_views(self):
        """The outputs that the widget manager rendered as widgets (without it, or when the
        kernel's widget models are unknown to it, a cell shows text instead)."""
        return self.panel.locator(".jp-OutputArea-output:has(> .jupyter-widgets)")

    def static_figures(self):
        """Figures shown by a cell itself, not by a widget's Output."""
        return self.panel.locator(
            '.jp-OutputArea-output[data-mime-type="image/png"]'
            ":not(.widget-output .jp-OutputArea-output) img"
        )

    def figures(self):
        return self.panel.locator(".jp-OutputArea-output img")

    def wait_figures_decoded(self, locator, timeout_ms: int = 30_000) -> None:
        deadline = time.monotonic() + timeout_ms / 1000
        while not locator.evaluate_all(IMAGES_DECODED):
            if time.monotonic() > deadline:
                raise AssertionError(f"figures not decoded after {timeout_ms} ms")
            # Offscreen content may be skipped by the browser until it is scrolled to.
            for index in range(locator.count()):
                locator.nth(index).scroll_into_view_if_needed()
            self.page.wait_for_timeout(200)

    def move_slider(self, view, label: str, presses: int = 1) -> tuple[str, str, str, str]:
        """Focus the slider called ``label`` in widget ``view`` and press the right arrow;
        wait for the figure to be redrawn. Returns (readout before, after, old src, new src)."""
        slider = view.locator(".widget-slider").filter(
            has=self.page.locator(".widget-label", has_text=label)
        )
        slider.scroll_into_view_if_needed()
        readout = slider.locator(".widget-readout")
        before = (readout.text_content() or "").strip()
        old = view.locator(".widget-output img").get_attribute("src")
        handle = slider.locator(".noUi-handle")
        handle.focus()
        for _ in range(presses):
            handle.press("ArrowRight")
        self.page.wait_for_function(NEW_FIGURE, arg=[view.element_handle(), old], timeout=60_000)
        new = view.locator(".widget-output img").get_attribute("src")
        return before, (readout.text_content() or "").strip(), old, new

    def settle(self) -> None:
        """Two animation frames: the browser has laid out and painted what was scrolled to
        (off-screen cells are skipped until then: JupyterLab's content-visibility mode)."""
        self.page.evaluate(
            "() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)))"
        )

    def screenshot_outputs(self, folder: Path, stem: str) -> list[Path]:
        """The viewport scrolled to each widget, figure and check report: what a learner sees
        there."""
        shots = []
        targets = [
            ("widget", self.widget_views()),
            ("figure", self.static_figures()),
            ("report", self.panel.locator(".jp-RenderedHTMLCommon.jp-OutputArea-output pre")),
        ]
        for kind, locator in targets:
            for index in range(locator.count()):
                target = locator.nth(index)
                try:
                    for _ in range(2):  # sizes change once the cell is painted: scroll again
                        target.scroll_into_view_if_needed(timeout=5_000)
                        self.settle()
                    path = folder / f"{stem}-{kind}{index}.png"
                    self.page.screenshot(path=str(path), timeout=10_000)
                    shots.append(path)
                except Exception:  # noqa: BLE001 - a screenshot must not hide the real failure
                    pass
        return shots
