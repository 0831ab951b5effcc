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
(everything else is 404), requests must name 127.0.0.1 or localhost as their one Host
header (so a web page that rebinds its own DNS name to 127.0.0.1 gets nothing; two Host
headers are a 400), and only ``https://ui.perfetto.dev`` may read the response from a web
page.

When it ends: once the file has been sent in full, by GET, to a request from the Perfetto
UI's origin (the ``Origin`` header a browser puts on the UI's cross-origin fetch), or on
Ctrl-C. A HEAD, a plain ``curl`` or a page from another origin is answered and changes
nothing. Connections are served each in its own thread with a short timeout, so an idle
one (a browser opens spare connections ahead of time) holds up nothing.
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
from typing import Any, Final

from ptscope.errors import BadInputError, PtscopeError

__all__ = ["PERFETTO_ORIGIN", "PERFETTO_PORT", "ServeResult", "perfetto_link", "serve_trace"]

PERFETTO_ORIGIN: Final = "https://ui.perfetto.dev"
PERFETTO_PORT: Final = 9001
HOST: Final = "127.0.0.1"
_UNSAFE: Final = re.compile(r"[^A-Za-z0-9._-]")
CONNECTION_TIMEOUT: Final = 10.0
"""Seconds a connection may stay silent (reading a request, or taking the file's bytes)."""
MAX_CONNECTIONS: Final = 32
"""Connections answered at once; more are closed as they come."""


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


class _Server(http.server.ThreadingHTTPServer):
    """One file, until the Perfetto UI has fetched it once in full.

    Each connection has its own thread (at most :data:`MAX_CONNECTIONS` at once) and a
    short timeout, so a connection that says nothing (a browser's speculative preconnect)
    neither holds up the UI's fetch nor the end of the server."""

    daemon_threads = True  # an idle connection does not keep ptscope running at the end
    block_on_close = False

    def __init__(self, port: int, path: Path, name: str) -> None:
        self.trace_path = path
        self.trace_name = name
        self.done = threading.Event()
        self.requests = 0
        self._count = threading.Lock()
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__((HOST, port), _Handler)

    @property
    def fetched(self) -> bool:
        return self.done.is_set()

    def counted(self) -> None:
        with self._count:
            self.requests += 1

    def process_request(self, request: Any, client_address: Any) -> None:
        # Past MAX_CONNECTIONS at once the newest is closed at once: a flood of local
        # connections cannot make a thread each.
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], OSError):
            return  # a client that went away or timed out: nothing to tell the user
        super().handle_error(request, client_address)


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server
    server_version = "ptscope"
    protocol_version = "HTTP/1.1"
    timeout = CONNECTION_TIMEOUT  # seconds a connection may stay silent (each its own thread)

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

    def _checked(self) -> bool:
        """Count the request; answer 400 (more than one Host header: which one would
        count?) or 403 (a Host that is not this machine's loopback name) and say False."""
        self.server.counted()
        if len(self.headers.get_all("Host") or []) > 1:
            self._refuse(400)
            return False
        if not self._host_ok():
            self._refuse(403)
            return False
        return True

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
        if not self._checked():
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
        if not self._checked():
            return
        try:
            wanted = urllib.parse.urlsplit(self.path).path
        except ValueError:  # a path that is no URL (`GET //[ HTTP/1.1`): 400, and go on
            self._refuse(400)
            return
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
        # Only the UI's own fetch ends the server: a browser sends the page's Origin with
        # a cross-origin request, so a plain curl (or a HEAD) is served and changes nothing.
        if sent == size and self.headers.get("Origin") == PERFETTO_ORIGIN:
            self.server.done.set()


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
            server.handle_request()  # accepts one connection, answered in its own thread
        return ServeResult(url, server.fetched, server.requests)
