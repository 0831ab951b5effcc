"""Hand one trace file to the Perfetto UI: serve it once over HTTP on the loopback
interface and give the user a link that opens it.

Facts this relies on (checked against Perfetto's own sources and docs):

- ``https://ui.perfetto.dev/#!/?url=URL`` opens the trace at URL; the server must answer a
  plain GET and allow the UI's origin with CORS (``Access-Control-Allow-Origin``), per
  "Deep linking to the Perfetto UI" (perfetto.dev/docs/visualization/deep-linking-to-perfetto-ui).
- The UI's content-security policy lets it connect to ``http://127.0.0.1:9001`` (the port
  of ``trace_processor_shell --httpd``) and to no other local HTTP port
  (``setupContentSecurityPolicy`` in ``ui/src/frontend/index.ts``); Perfetto's own
  ``tools/open_trace_in_ui`` serves traces on that port for that reason.
- On start the UI probes ``http://127.0.0.1:9001/status`` for a trace processor; a 404
  there just means "none", and the UI goes on to fetch the URL.

Security: the socket is bound to 127.0.0.1 only; the one file is the only path served
(everything else is 404), requests must name 127.0.0.1 or localhost as their Host (so a
web page that rebinds its own DNS name to 127.0.0.1 gets nothing), and only
``https://ui.perfetto.dev`` may read the response from a web page.
"""

from __future__ import annotations

import errno
import http.server
import os
import re
import sys
import threading
import urllib.parse
import webbrowser
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ptscope.errors import BadInputError, PtscopeError

__all__ = ["PERFETTO_ORIGIN", "PERFETTO_PORT", "ServeResult", "perfetto_link", "serve_trace"]

PERFETTO_ORIGIN: Final = "https://ui.perfetto.dev"
PERFETTO_PORT: Final = 9001
HOST: Final = "127.0.0.1"
_UNSAFE: Final = re.compile(r"[^A-Za-z0-9._-]")


@dataclass
class ServeResult:
    url: str
    fetched: bool
    requests: int


def served_name(path: Path) -> str:
    """The URL path the file is served under: its name, with anything that would need
    escaping in a URL (or confuse the UI's ``#!/?url=`` parser) replaced by ``_``."""
    return _UNSAFE.sub("_", path.name) or "trace"


def perfetto_link(port: int, name: str) -> str:
    return f"{PERFETTO_ORIGIN}/#!/?url=http://{HOST}:{port}/{name}"


class _Server(http.server.HTTPServer):
    """One file, until it has been sent once in full."""

    def __init__(self, port: int, path: Path, name: str) -> None:
        self.trace_path = path
        self.trace_name = name
        self.fetched = False
        self.requests = 0
        super().__init__((HOST, port), _Handler)


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server
    server_version = "ptscope"
    protocol_version = "HTTP/1.1"
    timeout = 60  # seconds a silent connection may hold the (one-at-a-time) server

    def end_headers(self) -> None:
        # One request per connection: a browser's idle keep-alive connection must not
        # keep the server waiting once the file has been sent.
        self.send_header("Connection", "close")
        self.close_connection = True
        super().end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass  # the CLI says what matters; no access log on stderr

    def _host_ok(self) -> bool:
        host = (self.headers.get("Host") or "").rsplit(":", 1)[0].strip("[]")
        return host in (HOST, "localhost")

    def _cors(self) -> None:
        self.send_header("Access-Control-Allow-Origin", PERFETTO_ORIGIN)
        self.send_header("Vary", "Origin")

    def _refuse(self, code: int) -> None:
        self.send_response(code)
        self._cors()
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_OPTIONS(self) -> None:
        # A CORS preflight (Chrome sends one with Access-Control-Request-Private-Network
        # when a public page fetches a loopback URL): allow GET, nothing else.
        self.server.requests += 1
        if not self._host_ok():
            self._refuse(403)
            return
        self.send_response(204)
        self._cors()
        self.send_header("Access-Control-Allow-Methods", "GET, HEAD")
        requested = self.headers.get("Access-Control-Request-Headers")
        if requested:
            self.send_header("Access-Control-Allow-Headers", requested)
        self.send_header("Access-Control-Allow-Private-Network", "true")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)

    def _answer(self, *, body: bool) -> None:
        self.server.requests += 1
        if not self._host_ok():
            self._refuse(403)
            return
        wanted = urllib.parse.urlsplit(self.path).path
        if wanted != "/" + self.server.trace_name:
            self._refuse(404)
            return
        try:
            size = os.path.getsize(self.server.trace_path)
            source = open(self.server.trace_path, "rb")  # noqa: SIM115 (closed below)
        except OSError:
            self._refuse(404)
            return
        with source:
            self.send_response(200)
            self._cors()
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(size))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            if not body:
                return
            try:
                sent = 0
                while chunk := source.read(1 << 20):
                    self.wfile.write(chunk)
                    sent += len(chunk)
                self.wfile.flush()
            except OSError:
                return  # the client went away: keep serving
        if sent == size:
            self.server.fetched = True


def _can_open_browser() -> bool:
    """A graphical browser is likely: a display, macOS, or the user's $BROWSER. (Python's
    webbrowser would otherwise fall back to a text browser in this very terminal.)"""
    if os.environ.get("BROWSER"):
        return True
    if sys.platform == "darwin":
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def serve_trace(
    path: Path,
    *,
    port: int = PERFETTO_PORT,
    open_browser: bool = True,
    on_ready: Callable[[str], None] | None = None,
) -> ServeResult:
    """Serve ``path`` on ``http://127.0.0.1:PORT/NAME`` until it has been downloaded once
    (Ctrl-C raises KeyboardInterrupt as usual). ``on_ready`` gets the Perfetto link once
    the socket listens; a browser is opened on it when ``open_browser`` and one seems to
    be there."""
    if path.is_dir():
        raise BadInputError(f"{path} is a directory, not a trace")
    if not path.is_file():
        raise BadInputError(f"no such file: {path}")
    name = served_name(path)
    try:
        server = _Server(port, path, name)
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise PtscopeError(
                f"port {port} on {HOST} is in use (another `ptscope serve`, or "
                "trace_processor_shell --httpd?): stop it, or open the file in the UI by hand"
            ) from e
        if e.errno == errno.EACCES:
            raise PtscopeError(f"not allowed to listen on port {port} of {HOST}") from e
        raise PtscopeError(f"cannot listen on {HOST}:{port}: {e.strerror or e}") from e
    url = perfetto_link(server.server_address[1], name)
    with server:
        server.timeout = 0.5  # wake up now and then, so that Ctrl-C is seen
        if on_ready is not None:
            on_ready(url)
        if open_browser and _can_open_browser():
            threading.Thread(target=webbrowser.open_new_tab, args=(url,), daemon=True).start()
        while not server.fetched:
            server.handle_request()
        return ServeResult(url, server.fetched, server.requests)
