"""Go goroutines, end to end: ``ptscope run --backend emulated`` on a program built by
``go build`` (``tests/programs/go_pingpong.go``: two goroutines exchange 10,000 messages on
one thread), the trace read back with the third-party ``fxt`` reader, against the program's
own log of its enters and exits and the goroutine each ran on.

How goroutines show (``docs/architecture.md``, goroutine switches): on the thread's track,
each run of a goroutine is its own stack; at every switch (``runtime.gogo``'s jump) the
thread's frames end, and the next run's callers appear as it returns into them (flagged
``inferred_start``). So the stack never grows with the number of switches, and no frame of
one goroutine holds a call of the other.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ptscope.fxt.columns import read_columns
from ptscope.perftool import find_perf, perf_env
from ptscope.reconstruct import engine as reference_engine
from ptscope.record.emulated import record
from ptscope.timeline import Timeline
from support import fidelity, oracles, programs
from support.fidelity import record_and_decode

pytestmark = pytest.mark.slow

MESSAGES = 10_000
# One thread runs both goroutines; no preemption by signals (the run is deterministic).
GO_ENV = {"GOMAXPROCS": "1", "GODEBUG": "asyncpreemptoff=1"}


def own(slices: list[oracles.TraceSlice]) -> list[oracles.TraceSlice]:
    """Slices named as the program logs its functions (``main.ping`` -> ``ping``)."""
    return [
        oracles.TraceSlice(s.start, s.end, s.name.removeprefix("main."), s.flags) for s in slices
    ]


def goroutine_thread(found: dict[int, list[oracles.TraceSlice]]) -> list[oracles.TraceSlice]:
    """The thread that ran the goroutines (the Go runtime starts a few more)."""
    return own(max(found.values(), key=lambda s: sum(x.name == "main.bounce" for x in s)))


def traced(tmp: Path, messages: int) -> tuple[list[oracles.Activation], Path, Path]:
    """(the program's own log of calls, the trace, the recording's perf.data)."""
    exe = programs.build("go_pingpong")
    log = tmp / "go.log"
    trace, rec = record_and_decode(exe, tmp, str(messages), PTSCOPE_GO_LOG=str(log), **GO_ENV)
    (perf_data,) = rec.glob("perf.data*")
    return oracles.self_log_activations(log), trace, perf_data


@pytest.fixture(scope="module")
def long_run(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """10,000 messages, read back with ptscope's columnar reader (the third-party reader
    takes 20 s on its million slices; the short run below uses it)."""
    calls, trace, _ = traced(tmp_path_factory.mktemp("go"), MESSAGES)
    return calls, oracles.timeline_slices(read_columns(trace).to_timeline())


@pytest.fixture(scope="module")
def short_run(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    return traced(tmp_path_factory.mktemp("go"), 1_000)


def _keep(calls: list[oracles.Activation]) -> set[str]:
    return {c.name for c in calls}


def foreign(slices: list[oracles.TraceSlice], calls: list[oracles.Activation]) -> list[str]:
    """Calls of ours nested in a frame of ours that runs on another goroutine (each of our
    functions runs on one goroutine only). The design leaves none: at every switch the
    thread's frames end, so a run never sits on another goroutine's frames."""
    goroutine = {c.name: c.stack for c in calls}
    tree = oracles.nest(((s.start, s.end, s.name) for s in slices), goroutine.__contains__)
    above: list[str] = []
    out = []
    for depth, name in tree:
        del above[depth:]
        if above and goroutine[above[-1]] != goroutine[name]:
            out.append(f"{name} (goroutine {goroutine[name]}) inside {above[-1]}")
        above.append(name)
    return out


def _check(calls: list[oracles.Activation], found: dict[int, list[oracles.TraceSlice]]) -> None:
    slices = goroutine_thread(found)
    problems = oracles.check_own_stacks(slices, calls, _keep(calls).__contains__)
    problems += foreign(slices, calls)[:10]
    assert not problems, "\n".join(problems[:10])


def test_each_goroutine_keeps_its_own_frames(long_run: tuple, short_run: tuple) -> None:
    calls, found = long_run
    assert sum(c.name == "bounce" for c in calls) == MESSAGES
    assert {c.stack for c in calls} == {0, 1}  # the log itself: two goroutines
    _check(calls, found)
    calls, trace, perf_data = short_run
    _check(calls, oracles.fxt_slices(trace))  # the third-party reader
    _check(calls, oracles.timeline_slices(fidelity.reference_timeline(perf_data)))


def test_ping_pong_keeps_the_stack_depth_bounded(long_run: tuple) -> None:
    _, found = long_run
    slices = goroutine_thread(found)
    depths = [d for d, _ in oracles.nest(((s.start, s.end, s.name) for s in slices), bool)]
    assert len(depths) > 20 * MESSAGES  # the scheduler's calls are all there
    assert max(depths) < 40  # 20,000 switches, and no staircase


def test_negative_control_without_the_goroutine_rule(
    short_run: tuple, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With gogo's jump taken as an ordinary jump (the reference engine without the rule),
    one goroutine's runs nest under the other's frames: the check sees it."""
    calls, _, perf_data = short_run
    monkeypatch.setattr(reference_engine, "GOROUTINE_SWITCHERS", frozenset())
    timeline: Timeline = fidelity.reference_timeline(perf_data)
    assert len(foreign(goroutine_thread(oracles.timeline_slices(timeline)), calls)) > 100


def _count(perf_data: Path, *patterns: bytes) -> list[int]:
    """How often each pattern occurs in ``perf script --itrace=be -F tid,flags`` (counted in
    blocks: the output is large)."""
    perf = subprocess.Popen(
        [find_perf().path, "script", "-i", str(perf_data), "--itrace=be", "-F", "tid,flags"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=perf_env(),
    )
    assert perf.stdout is not None
    counts = [0] * len(patterns)
    carry = b""
    while block := perf.stdout.read(1 << 20):
        cut = block.rfind(b"\n") + 1
        text, carry = carry + block[:cut], block[cut:]
        for k, pattern in enumerate(patterns):
            counts[k] += text.count(pattern)
    for k, pattern in enumerate(patterns):
        counts[k] += carry.count(pattern)
    assert perf.wait() == 0
    return counts


def test_asynchronous_preemption_decodes_without_an_error(tmp_path: Path) -> None:
    """CPU-bound goroutines, preempted by signals whose handler moves the resume point
    (runtime.asyncPreempt): perf decodes every preemption (the old recorder wrote the
    point after rt_sigreturn as the interrupted one: 18-24 errors in every such run)."""
    exe = programs.build("go_spin")
    result = record([str(exe)], tmp_path / "rec")
    assert result.exit_code == 0
    errors, interruptions = _count(
        tmp_path / "rec" / "perf.data", b"instruction trace error", b"tr end  async"
    )
    assert errors == 0
    assert interruptions > 5  # the runtime did preempt
