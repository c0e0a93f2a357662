"""Headless Chromium for the tests, driven over the DevTools protocol (a websocket: no Playwright,
no driver download). Debian's ``chromium`` (``apt-get install chromium``; ``.ci/run`` installs it);
tests that need it skip where it is absent.

``Browser.open(url, ready)`` loads a page and waits until the JavaScript expression ``ready`` is
true (a React app such as MLflow's UI renders after its API calls return), ``evaluate`` reads the
page, ``screenshot`` keeps a full-page PNG.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--no-default-browser-check",
         "--disable-dev-shm-usage", "--hide-scrollbars", "--window-size=1400,1000"]


def chromium_path() -> str | None:
    return os.environ.get("DDLIB_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    def __init__(self, profile: Path, timeout: float = 60.0):
        import websocket  # websocket-client (pinned in the test extra)

        binary = chromium_path()
        if binary is None:
            raise RuntimeError("chromium is not installed")
        # Chromium keeps its singleton socket in an ``org.chromium.Chromium.*`` folder under $TMPDIR and
        # leaves it there when terminated: give it a $TMPDIR of its own, removed by ``close`` (short, as a
        # socket's path must be under 108 bytes).
        self.scratch = tempfile.mkdtemp(prefix="ddlib-chromium-")
        self.process = subprocess.Popen(
            [binary, *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
            env={**os.environ, "TMPDIR": self.scratch})
        deadline, port = time.monotonic() + timeout, None
        while port is None:  # "DevTools listening on ws://127.0.0.1:PORT/devtools/browser/<id>"
            line = self.process.stderr.readline()
            if not line and self.process.poll() is not None:
                shutil.rmtree(self.scratch, ignore_errors=True)
                raise RuntimeError(f"chromium exited with {self.process.returncode}")
            found = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
            port = int(found.group(1)) if found else None
            if time.monotonic() > deadline:
                self.close()
                raise RuntimeError("chromium did not open its DevTools port")
        threading_drain(self.process.stderr)
        targets = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10).read())
        page = next(t for t in targets if t.get("type") == "page")
        self.socket = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=timeout, suppress_origin=True)
        self.ids = itertools.count(1)
        self.send("Page.enable")

    def send(self, method: str, **params):
        message_id = next(self.ids)
        self.socket.send(json.dumps({"id": message_id, "method": method, "params": params}))
        while True:
            reply = json.loads(self.socket.recv())
            if reply.get("id") == message_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def set_viewport(self, width: int, height: int) -> None:
        """Lay pages out in a ``width`` x ``height`` window (CSS pixels), kept across navigations."""
        self.viewport = (width, height)
        self.send("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)

    def evaluate(self, expression: str):
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def open(self, url: str, ready: str = "true", timeout: float = 60.0) -> None:
        """Navigate, then wait until the page has loaded and ``ready`` (JavaScript) is true."""
        self.send("Page.navigate", url=url)
        deadline = time.monotonic() + timeout
        check = f"document.readyState === 'complete' && Boolean({ready})"
        while not self.evaluate(check):
            if time.monotonic() > deadline:
                text = self.evaluate("document.body ? document.body.innerText : ''") or ""
                raise TimeoutError(f"{url}: not ready after {timeout:.0f} s ({ready}); page text: {text[:500]!r}")
            time.sleep(0.5)

    def screenshot(self, path: Path, full_page: bool = True) -> Path:
        if full_page:
            size = self.send("Page.getLayoutMetrics")["cssContentSize"]
            self.send("Emulation.setDeviceMetricsOverride", width=1400, height=min(int(size["height"]) + 1, 12000),
                      deviceScaleFactor=1, mobile=False)
        data = self.send("Page.captureScreenshot", format="png", captureBeyondViewport=full_page)["data"]
        if full_page:
            self.send("Emulation.clearDeviceMetricsOverride")
            if getattr(self, "viewport", None):
                self.set_viewport(*self.viewport)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            self.socket.close()
        except Exception:  # noqa: BLE001 - closing anyway
            pass
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        shutil.rmtree(self.scratch, ignore_errors=True)


def threading_drain(stream) -> None:
    """Keep reading chromium's stderr so a full pipe never blocks it."""
    import threading

    threading.Thread(target=lambda: [None for _ in stream], daemon=True).start()
