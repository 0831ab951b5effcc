"""`ptscope stats`, `flame` and `serve` end to end through the CLI, on the trace of a real
program (recorded with the emulated backend, decoded by the real perf), and their errors
on bad input: a missing trace, a file that is not a trace, an empty trace, a directory,
a port in use."""

from __future__ import annotations

import csv
import io
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from ptscope.fxt import write_timeline
from ptscope.record.emulated import record
from ptscope.timeline import Timeline
from support.cli import one_line_error, ptscope
from support.programs import build
from support.stats_truth import clip, function_truth, third_party_calls

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """basics (recursive fib, calls through pointers, libc) under the emulated backend."""
    directory = tmp_path_factory.mktemp("rec")
    record([str(build("basics")), "12"], directory)
    out = directory / "basics.fxt.gz"
    done = ptscope("decode", str(directory), "-o", str(out))
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="module")
def bad_inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The bad input every command that reads a trace must refuse in one line."""
    where = tmp_path_factory.mktemp("bad")
    (where / "notes.txt").write_text("not a trace\n")
    (where / "empty.fxt").write_bytes(b"")
    write_timeline(Timeline(), where / "nothing.fxt.gz")  # a valid trace with no calls
    (where / "dir.fxt").mkdir()
    return {
        "missing": where / "missing.fxt.gz",
        "not a trace": where / "notes.txt",
        "empty file": where / "empty.fxt",
        "no calls": where / "nothing.fxt.gz",
        "directory": where / "dir.fxt",
    }


MESSAGES = {
    "missing": "no such file",
    "not a trace": "not a Fuchsia trace",
    "empty file": "empty file",
    "no calls": "holds no calls",
    "directory": "is a directory",
}


@pytest.mark.parametrize("exact", [True, False], ids=["exact", "histogram"])
def test_stats_json_matches_the_obvious_computation(trace: Path, exact: bool) -> None:
    done = ptscope("stats", str(trace), "--json", "--top", "0", *(["--exact"] if exact else []))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    truth = function_truth(third_party_calls(trace))
    got = {f["name"]: f for f in report["functions"]}
    assert set(got) == set(truth)
    for name, t in truth.items():
        f = got[name]
        assert (f["calls"], f["total_ns"], f["self_ns"], f["max_ns"]) == (
            t.calls, t.total, t.self_time, max(t.durations)
        ), name  # fmt: skip
        percentiles = (f["p50_ns"], f["p90_ns"], f["p99_ns"])
        expected = tuple(t.percentile(q) for q in (50, 90, 99))
        if exact:
            assert percentiles == expected
        else:  # the README's bound: 0.4 % (and 1 ns of rounding)
            for value, want in zip(percentiles, expected, strict=True):
                assert abs(value - want) <= 0.004 * want + 1, (name, value, want)
    # fib(12) calls itself 464 times; its time counts once, within main's.
    assert got["fib"]["calls"] == 465 and got["main"]["calls"] == 1
    assert got["fib"]["total_ns"] < got["main"]["total_ns"]
    assert got["fib"]["total_ns"] == max(truth["fib"].durations)
    assert [f["name"] for f in report["functions"]][:1] == ["_start"]  # sorted by total


def test_stats_options(trace: Path) -> None:
    window = ptscope("stats", str(trace), "--json", "--top", "0", "--time", "20us,40us")
    assert window.returncode == 0, window.stderr
    data = json.loads(window.stdout)
    assert data["window_ns"] == [20_000, 40_000]
    truth = function_truth(clip(third_party_calls(trace), 20_000, 40_000))
    assert {f["name"]: f["total_ns"] for f in data["functions"]} == {
        n: t.total for n, t in truth.items()
    }
    [tid] = [t["tid"] for t in data["threads"]]
    picked = ptscope("stats", str(trace), "--csv", "--sort", "calls", "--match", "^(fib|main)$",
                     "--tid", str(tid))  # fmt: skip
    rows = list(csv.DictReader(io.StringIO(picked.stdout)))
    assert [r["name"] for r in rows] == ["fib", "main"]
    assert rows[0]["calls"] == "465"
    table = ptscope("stats", str(trace), "--top", "5")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert "calls on 1 thread" in lines[0] and lines[1].split()[:4] == [
        "function", "calls", "total", "%"
    ]  # fmt: skip
    assert len([ln for ln in lines if "%" in ln]) == 6  # the header and 5 functions
    assert "--top 0 for all" in lines[-1]


def test_flame_graph_and_chart_files(trace: Path, tmp_path: Path) -> None:
    for extra in ([], ["--chart"]):
        out = tmp_path / f"f{len(extra)}.svg"
        done = ptscope("flame", str(trace), "-o", str(out), *extra, "--title", "basics")
        assert done.returncode == 0, done.stderr
        assert done.stdout == "" and done.stderr.startswith(f"wrote {out}: ")
        root = ET.parse(out).getroot()
        names = {
            (g.find("{http://www.w3.org/2000/svg}title").text or "").split("\n")[0]  # type: ignore[union-attr]
            for g in root.iter("{http://www.w3.org/2000/svg}g")
            if g.get("class") == "f"
        }
        assert {"_start", "main", "fib"} <= names


@pytest.mark.parametrize("command", ["stats", "flame", "serve"])
@pytest.mark.parametrize("case", list(MESSAGES))
def test_bad_input_is_one_line(
    command: str, case: str, bad_inputs: dict[str, Path], tmp_path: Path
) -> None:
    if command == "serve" and case == "no calls":
        pytest.skip("a valid trace with nothing in it is served as it is")
    extra = {"flame": ["-o", str(tmp_path / "x.svg")], "serve": ["--no-browser", "--port", "0"]}
    done = ptscope(command, str(bad_inputs[case]), *extra.get(command, []), timeout=60)
    line = one_line_error(done, 3)
    assert MESSAGES[case] in line, line
    assert not (tmp_path / "x.svg").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--time", "5ms"], "give START,END"),
        (["--tid", "1,x"], "comma-separated list"),
        (["--tid", "99999"], "no thread 99999"),
        (["--match", "("], "not a regular expression"),
        (["--time", "1s,2s"], "no calls in that time window"),
    ],
)
def test_bad_options_are_one_line(trace: Path, args: list[str], message: str) -> None:
    line = one_line_error(ptscope("stats", str(trace), *args))
    assert message in line


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_serving(*args: str) -> tuple[subprocess.Popen[str], str]:
    """``ptscope serve ARGS`` in the background, once it has printed the link."""
    server = subprocess.Popen(
        [sys.executable, "-m", "ptscope", "serve", "--no-browser", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert server.stderr is not None
    for line in server.stderr:
        if line.startswith("open in Perfetto: "):
            return server, line.split(": ", 1)[1].strip()
    server.wait(10)
    raise AssertionError(f"no link printed: {server.stdout.read() if server.stdout else ''}")


def request(
    url: str, method: str = "GET", headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as reply:
            return reply.status, dict(reply.headers), reply.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), b""


def test_serve_hands_the_file_to_perfetto_once(trace: Path) -> None:
    port = free_port()
    server, link = start_serving(str(trace), "--port", str(port))
    try:
        assert link == f"https://ui.perfetto.dev/#!/?url=http://127.0.0.1:{port}/{trace.name}"
        base = f"http://127.0.0.1:{port}"
        # The UI probes for a trace processor first: not here.
        assert request(f"{base}/status")[0] == 404
        assert request(f"{base}/../{trace.name}")[0] == 404
        # A page that rebinds its own name to 127.0.0.1 gets nothing.
        assert request(f"{base}/{trace.name}", headers={"Host": "evil.example"})[0] == 403
        status, headers, _ = request(
            f"{base}/{trace.name}",
            "OPTIONS",
            {"Origin": "https://ui.perfetto.dev", "Access-Control-Request-Method": "GET",
             "Access-Control-Request-Private-Network": "true"},
        )  # fmt: skip
        assert status == 204
        assert headers["Access-Control-Allow-Origin"] == "https://ui.perfetto.dev"
        assert headers["Access-Control-Allow-Private-Network"] == "true"
        status, headers, body = request(
            link.split("url=", 1)[1], headers={"Origin": "https://ui.perfetto.dev"}
        )
        assert status == 200 and body == trace.read_bytes()
        assert headers["Access-Control-Allow-Origin"] == "https://ui.perfetto.dev"
        assert server.wait(10) == 0  # done once the trace was fetched
        assert server.stderr is not None and "fetched" in server.stderr.read()
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def test_serve_refuses_a_port_in_use(trace: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = one_line_error(ptscope("serve", str(trace), "--no-browser", "--port", str(port)), 1)
    assert f"port {port} on 127.0.0.1 is in use" in line


def port_9001_free() -> bool:
    with socket.socket() as s:
        # As the server binds (a closed connection's TIME_WAIT does not count).
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", 9001))
        except OSError:
            return False
    return True


def test_decode_serve_uses_perfetto_port(trace: Path, tmp_path: Path) -> None:
    """`decode --serve` after writing the trace, on the one port the UI accepts."""
    if not port_9001_free():
        pytest.skip("port 9001 is in use on this machine")
    recording = trace.parent
    out = tmp_path / "again.fxt.gz"
    server = subprocess.Popen(
        [sys.executable, "-m", "ptscope", "decode", str(recording), "-o", str(out), "--serve"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={
            k: v
            for k, v in os.environ.items()
            if k not in ("DISPLAY", "WAYLAND_DISPLAY", "BROWSER")
        },
    )
    try:
        assert server.stderr is not None
        link = next(ln for ln in server.stderr if ln.startswith("open in Perfetto: "))
        assert link.strip().endswith("url=http://127.0.0.1:9001/again.fxt.gz")
        deadline = time.monotonic() + 10
        while True:
            try:
                status, _, body = request(
                    "http://127.0.0.1:9001/again.fxt.gz",
                    headers={"Origin": "https://ui.perfetto.dev"},
                )
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        assert status == 200 and body == out.read_bytes()
        assert server.wait(10) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
