"""``ptscope serve`` over real sockets (issue 20, item 10): connections are served at once
each in its own thread, so an idle one (a browser's speculative preconnect) holds nothing
up; only the Perfetto UI's complete GET (its Origin) ends the server, never a HEAD or a
plain curl; a request with two Host headers is refused (400)."""

from __future__ import annotations

import http.client
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ptscope.fxt import write_timeline
from ptscope.timeline import Timeline

PERFETTO = {"Origin": "https://ui.perfetto.dev"}


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "t.fxt.gz"
    write_timeline(Timeline(), path)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def server(trace: Path) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """``ptscope serve`` on a free port, once it listens."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ptscope", "serve", "--no-browser", "--port", str(port), str(trace)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        if line.startswith("open in Perfetto: "):
            break
    try:
        yield proc, port
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def fetch(port: int, path: str, method: str = "GET", headers: dict[str, str] | None = None,
          timeout: float = 5) -> tuple[int, bytes]:  # fmt: skip
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request(method, path, headers=headers or {})
        reply = connection.getresponse()
        return reply.status, reply.read()
    finally:
        connection.close()


def still_serving(proc: subprocess.Popen[str]) -> bool:
    time.sleep(0.3)
    return proc.poll() is None


def test_an_idle_connection_does_not_hold_up_the_fetch(
    server: tuple[subprocess.Popen[str], int], trace: Path
) -> None:
    proc, port = server
    with socket.create_connection(("127.0.0.1", port)) as idle:  # says nothing, stays open
        idle.sendall(b"GET /t.fxt.gz HTTP/1.1\r\n")  # and one that stops half-way
        with socket.create_connection(("127.0.0.1", port)):
            started = time.monotonic()
            status, body = fetch(port, "/t.fxt.gz", headers=PERFETTO)
            assert time.monotonic() - started < 2
        assert (status, body) == (200, trace.read_bytes())
        assert proc.wait(5) == 0  # the UI's fetch ended it, idle connections or not
    assert proc.stderr is not None and "fetched" in proc.stderr.read()


def test_head_and_a_plain_get_do_not_end_it(
    server: tuple[subprocess.Popen[str], int], trace: Path
) -> None:
    proc, port = server
    assert fetch(port, "/t.fxt.gz", "HEAD", PERFETTO) == (200, b"")
    assert still_serving(proc)
    assert fetch(port, "/t.fxt.gz") == (200, trace.read_bytes())  # curl, a script...
    assert still_serving(proc)
    other = {"Origin": "https://evil.example"}
    assert fetch(port, "/t.fxt.gz", headers=other) == (200, trace.read_bytes())
    assert still_serving(proc)
    assert fetch(port, "/status", headers=PERFETTO)[0] == 404
    assert still_serving(proc)
    assert fetch(port, "/t.fxt.gz", headers=PERFETTO) == (200, trace.read_bytes())
    assert proc.wait(5) == 0


def raw(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(request)
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    return reply


def test_two_host_headers_are_refused(server: tuple[subprocess.Popen[str], int]) -> None:
    proc, port = server
    for hosts in (
        b"Host: 127.0.0.1\r\nHost: evil.example\r\n",
        b"Host: localhost\r\nHost: 127.0.0.1\r\n",
        b"Host: evil.example\r\nHost: 127.0.0.1\r\n",
    ):
        for method in (b"GET", b"HEAD", b"OPTIONS"):
            reply = raw(
                port,
                method + b" /t.fxt.gz HTTP/1.1\r\n" + hosts
                + b"Origin: https://ui.perfetto.dev\r\n\r\n",
            )  # fmt: skip
            assert reply.startswith(b"HTTP/1.1 400 "), reply[:80]
    assert still_serving(proc)
    one = raw(port, b"HEAD /t.fxt.gz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert one.startswith(b"HTTP/1.1 200 ")


def test_a_silent_connection_is_closed_after_the_timeout(
    server: tuple[subprocess.Popen[str], int],
) -> None:
    from ptscope.serve import CONNECTION_TIMEOUT

    _, port = server
    with socket.create_connection(("127.0.0.1", port)) as idle:
        idle.settimeout(CONNECTION_TIMEOUT + 10)
        started = time.monotonic()
        assert idle.recv(1) == b""  # closed by the server
        assert CONNECTION_TIMEOUT - 1 < time.monotonic() - started < CONNECTION_TIMEOUT + 5


def test_a_path_that_is_no_url_is_a_400_not_a_traceback(
    server: tuple[subprocess.Popen[str], int],
) -> None:
    """A request path that is no URL (issue 44, item 16: ``GET http://[::1``, on which
    urlsplit raises ``Invalid IPv6 URL``): the server answers 400 (it wrote a traceback
    and no answer), and goes on serving."""
    proc, port = server
    for path in (b"//[", b"http://[::1", b"//[x"):
        reply = raw(port, b"GET " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        # (http.server turns a leading // into /: `//[` asks for `/[`, a 404)
        assert reply.startswith((b"HTTP/1.1 400 ", b"HTTP/1.1 404 ")), (path, reply[:80])
    assert still_serving(proc)
    one = raw(port, b"HEAD /t.fxt.gz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert one.startswith(b"HTTP/1.1 200 ")
    proc.kill()
    _, err = proc.communicate()
    assert "Traceback" not in err and "ValueError" not in err, err
