"""A real headless Chromium driven over the DevTools protocol, for tests of what ptscope
writes for browsers (the flame graph SVG).

The protocol runs over a pipe (``--remote-debugging-pipe``: the browser reads commands on
fd 3 and writes replies and events on fd 4, JSON messages ended by a NUL byte), so there
is no port to find or to share with other tests. Script exceptions
(``Runtime.exceptionThrown``), ``console.error`` calls and error log entries are
collected as they come; :meth:`Page.errors` returns them.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["HeadlessChromium", "Page", "find_chromium", "open_file"]

# This machine's notes: what Chromium needs to start headless in a container, quietly.
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path is not None:
            return path
    return None


@dataclass
class Page:
    browser: HeadlessChromium
    session: str
    events: list[dict[str, Any]] = field(default_factory=list)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        return self.browser.call(method, params, session=self.session)

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (an exception fails)."""
        reply = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in reply:
            raise AssertionError(f"{expression!r} threw: {reply['exceptionDetails']}")
        return reply["result"].get("value")

    def screenshot(self) -> bytes:
        """The viewport as PNG."""
        return base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"])

    def errors(self) -> list[str]:
        """Script errors, console errors and error log entries so far."""
        self.browser.drain()
        found = []
        for event in self.browser.events:
            if event.get("sessionId") != self.session:
                continue
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                text = details.get("exception", {}).get("description") or details.get("text")
                found.append(f"exception: {text} (line {details.get('lineNumber')})")
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                found.append(f"console.{params['type']}: {params.get('args')}")
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                found.append(f"log: {params['entry'].get('text')}")
        return found


class HeadlessChromium:
    """``with HeadlessChromium() as browser: page = browser.open(url)``."""

    def __init__(self, *, width: int = 1200, height: int = 800, timeout: float = 30) -> None:
        executable = find_chromium()
        if executable is None:
            raise FileNotFoundError("chromium")
        self.width, self.height, self.timeout = width, height, timeout
        self.profile = tempfile.mkdtemp(prefix="ptscope-chromium-")
        self.events: list[dict[str, Any]] = []
        self._buffer = b""
        self._next_id = 0
        commands_read, self._commands = os.pipe()
        self._replies, replies_write = os.pipe()
        # The child's fds 3 and 4: dup2'd in the child from fds above any they might hit.
        high_read = fcntl.fcntl(commands_read, fcntl.F_DUPFD_CLOEXEC, 10)
        high_write = fcntl.fcntl(replies_write, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(commands_read)
        os.close(replies_write)

        def child_fds() -> None:
            os.dup2(high_read, 3)  # dup2 clears close-on-exec on the copies
            os.dup2(high_write, 4)

        self.stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed by close())
        self.process = subprocess.Popen(
            [
                executable,
                *FLAGS,
                f"--user-data-dir={self.profile}",
                "--remote-debugging-pipe",
                "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self.stderr,
            close_fds=False,  # fds 3 and 4 must survive; the rest are close-on-exec
            preexec_fn=child_fds,
        )
        os.close(high_read)
        os.close(high_write)

    def __enter__(self) -> HeadlessChromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, method: str, params: dict[str, Any], session: str | None) -> int:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        os.write(self._commands, json.dumps(message).encode() + b"\0")
        return self._next_id

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self._replies], [], [], timeout)
        if not ready:
            return False
        chunk = os.read(self._replies, 1 << 20)
        if not chunk:
            raise RuntimeError(f"chromium exited: {self.stderr_text()[-2000:]}")
        self._buffer += chunk
        return True

    def _messages(self) -> list[dict[str, Any]]:
        out = []
        while b"\0" in self._buffer:
            raw, self._buffer = self._buffer.split(b"\0", 1)
            out.append(json.loads(raw))
        return out

    def drain(self) -> None:
        """Collect the events that have arrived."""
        while self._read(0.05):
            pass
        self.events += self._messages()

    def call(
        self, method: str, params: dict[str, Any] | None = None, *, session: str | None = None
    ) -> dict[str, Any]:
        wanted = self._send(method, params or {}, session)
        deadline = time.monotonic() + self.timeout
        while True:
            for message in self._messages():
                if message.get("id") == wanted:
                    if "error" in message:
                        raise RuntimeError(f"{method}: {message['error']}")
                    result: dict[str, Any] = message["result"]
                    return result
                self.events.append(message)
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no reply to {method} in {self.timeout} s")
            self._read(left)

    def wait_for(self, method: str, session: str) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout
        seen = 0
        while True:
            self.events += self._messages()
            for event in self.events[seen:]:
                if event.get("method") == method and event.get("sessionId") == session:
                    return event
            seen = len(self.events)
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no {method} in {self.timeout} s")
            self._read(left)

    def open(self, url: str) -> Page:
        """A new tab showing ``url``, once its load event has fired."""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})
        page = Page(self, session["sessionId"])
        for domain in ("Runtime", "Log", "Page"):
            page.call(f"{domain}.enable")
        page.call(
            "Emulation.setDeviceMetricsOverride",
            width=self.width,
            height=self.height,
            deviceScaleFactor=1,
            mobile=False,
        )
        page.call("Page.navigate", url=url)
        self.wait_for("Page.loadEventFired", page.session)
        return page

    def stderr_text(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode("utf-8", "replace")

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self._send("Browser.close", {}, None)
                self.process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()
        for fd in (self._commands, self._replies):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.stderr.close()
        shutil.rmtree(self.profile, ignore_errors=True)


def open_file(browser: HeadlessChromium, path: Path) -> Page:
    return browser.open(path.resolve().as_uri())
