"""Every perf record argv ptscope builds, against what perf-record(1) / perf-intel-pt(1)
document for each option."""

from __future__ import annotations

import itertools
import re
import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ptscope.errors import UsageError
from ptscope.record.perf_commands import (
    NORMAL_TIMER,
    PT_CONFIG_TERMS,
    CallgraphMode,
    Control,
    IntelPtRecordOptions,
    SamplingRecordOptions,
    SnapshotMode,
    Targets,
    TraceScope,
    intel_pt_record_argv,
    parse_size,
    parse_timer_resolution,
    sampling_record_argv,
    snapshot_pages,
)

OUT = Path("/rec/perf.data")
CTL = Control(Path("/rec/ctl"), Path("/rec/ack"))


def pt_argv(**kw: object) -> list[str]:
    opts = IntelPtRecordOptions(output=OUT, targets=kw.pop("targets", Targets((42,))), **kw)  # type: ignore[arg-type]
    return intel_pt_record_argv("perf", opts)


def test_intel_pt_default_is_snapshot_at_exit_main_thread_normal_timing() -> None:
    assert pt_argv() == [
        "perf",
        "record",
        "-o",
        "/rec/perf.data",
        "--timestamp",
        "--event=intel_pt/cyc=1,cyc_thresh=1,mtc_period=0/u",
        "--per-thread",
        "-t",
        "42",
        "--snapshot=e",
    ]


@pytest.mark.parametrize(
    ("timer", "config"),
    [
        ("low", ""),
        ("normal", "cyc=1,cyc_thresh=1,mtc_period=0"),
        ("high", "cyc=1,cyc_thresh=1,mtc_period=0,noretcomp=1"),
        ("cyc=1,mtc_period=3", "cyc=1,mtc_period=3"),
        ("psb_period=2,noretcomp", "psb_period=2,noretcomp=1"),
        ("mtc=0,cyc_thresh=15", "mtc=0,cyc_thresh=15"),
    ],
)
@pytest.mark.parametrize(
    ("scope", "suffix"), [(TraceScope.USER, "u"), (TraceScope.KERNEL, "k"), (TraceScope.BOTH, "uk")]
)
def test_intel_pt_event_terms_and_modifiers(
    timer: str, config: str, scope: TraceScope, suffix: str
) -> None:
    argv = pt_argv(timer=parse_timer_resolution(timer), scope=scope)
    assert argv[5] == f"--event=intel_pt/{config}/{suffix}"


# Every combination of the independent switches, each checked for the argument it adds.
SWITCHES = list(
    itertools.product(
        [SnapshotMode.FULL, SnapshotMode.ON_REQUEST, SnapshotMode.AT_EXIT],
        [False, True],  # all threads
        [False, True],  # control fifo
        [None, 16],  # AUX pages
        [TraceScope.USER, TraceScope.BOTH],
        [False, True],  # kcore (kernel scopes only)
        [False, True],  # multi-snapshot (snapshot modes only)
    )
)


@pytest.mark.parametrize(
    ("snapshot", "all_threads", "control", "pages", "scope", "kcore", "multi"), SWITCHES
)
def test_intel_pt_every_switch_combination(
    snapshot: SnapshotMode,
    all_threads: bool,
    control: bool,
    pages: int | None,
    scope: TraceScope,
    kcore: bool,
    multi: bool,
) -> None:
    kw: dict[str, object] = {
        "targets": Targets((7, 9), all_threads=all_threads),
        "snapshot": snapshot,
        "control": CTL if control else None,
        "snapshot_size": snapshot_pages(pages * 4096) if pages else None,
        "scope": scope,
        "kcore": kcore,
        "multi_snapshot": multi,
    }
    if multi and snapshot is SnapshotMode.FULL:
        with pytest.raises(UsageError, match="--multi-snapshot"):
            pt_argv(**kw)
        return
    if kcore and not scope.includes_kernel:
        with pytest.raises(UsageError, match="--kcore"):
            pt_argv(**kw)
        return
    argv = pt_argv(**kw)
    expected = ["perf", "record", "-o", "/rec/perf.data", "--timestamp"]
    expected.append(f"--event=intel_pt/cyc=1,cyc_thresh=1,mtc_period=0/{scope.value}")
    if multi:
        expected.append("--switch-output=signal")
    expected += ["-p", "7,9"] if all_threads else ["--per-thread", "-t", "7,9"]
    expected += {
        SnapshotMode.FULL: [],
        SnapshotMode.ON_REQUEST: ["--snapshot"],
        SnapshotMode.AT_EXIT: ["--snapshot=e"],
    }[snapshot]
    if control:
        expected.append("--control=fifo:/rec/ctl,/rec/ack")
    if kcore:
        expected.append("--kcore")
    if pages:
        expected.append(f"-m,{pages}")
    assert argv == expected


def test_start_disabled_uses_delay_minus_one() -> None:
    assert "--delay=-1" in pt_argv(start_disabled=True)


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("4096", 4096),
        ("4K", 4096),
        ("4k", 4096),
        ("1M", 1 << 20),
        ("1.5MiB", 3 << 19),
        ("2G", 2 << 30),
    ],
)
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "M", "-4K", "4X", "four"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(UsageError):
        parse_size(text)


@pytest.mark.parametrize(
    ("requested", "pages", "changed"),
    [
        (4096, 1, False),
        (1, 1, True),
        (4097, 2, True),
        (3 << 20, 1024, True),
        (4 << 20, 1024, False),
    ],
)
def test_snapshot_size_rounds_to_power_of_two_pages(
    requested: int, pages: int, changed: bool
) -> None:
    size = snapshot_pages(requested)
    assert size.pages == pages
    assert size.changed is changed
    assert (size.warning() is not None) is changed


@given(st.integers(min_value=1, max_value=1 << 40))
def test_snapshot_pages_property(requested: int) -> None:
    size = snapshot_pages(requested)
    assert size.pages & (size.pages - 1) == 0  # a power of two
    assert size.bytes >= requested  # never smaller than asked
    assert size.bytes < 2 * max(requested, 4096) + 4096  # and not much bigger


@pytest.mark.parametrize(
    "text",
    ["bogus", "cyc=2", "mtc_period=16", "cyc=1,cyc=1", "cyc=x", "tsc=1"],
)
def test_timer_resolution_rejects(text: str) -> None:
    with pytest.raises(UsageError):
        parse_timer_resolution(text)


def test_timer_resolution_custom_accepts_every_documented_term() -> None:
    text = ",".join(f"{k}={hi}" for k, (_lo, hi) in PT_CONFIG_TERMS.items())
    assert parse_timer_resolution(text).pt_config() == text


def sampling_argv(**kw: object) -> list[str]:
    base: dict[str, object] = {
        "output": OUT,
        "targets": Targets((5,)),
        "callgraph": CallgraphMode.DWARF,
        "hardware_events": False,
    }
    base.update(kw)
    return sampling_record_argv("perf", SamplingRecordOptions(**base))  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", list(CallgraphMode))
@pytest.mark.parametrize("hardware", [False, True])
@pytest.mark.parametrize("scope", list(TraceScope))
@pytest.mark.parametrize("control", [False, True])
def test_sampling_argv(
    mode: CallgraphMode, hardware: bool, scope: TraceScope, control: bool
) -> None:
    argv = sampling_argv(
        callgraph=mode,
        hardware_events=hardware,
        scope=scope,
        frequency=999,
        control=CTL if control else None,
    )
    event = "cycles" if hardware else "cpu-clock"
    expected = [
        "perf",
        "record",
        "-o",
        "/rec/perf.data",
        "--timestamp",
        f"--event={event}:{scope.value}",
        "-F",
        "999",
        f"--call-graph={mode.value}",
        "--per-thread",
        "-t",
        "5",
    ]
    if control:
        expected.append("--control=fifo:/rec/ctl,/rec/ack")
    assert argv == expected


def test_sampling_dwarf_stack_size_and_all_threads() -> None:
    argv = sampling_argv(dwarf_stack_size=16384, targets=Targets((1, 2), all_threads=True))
    assert "--call-graph=dwarf,16384" in argv
    assert argv[-2:] == ["-p", "1,2"]


def test_sampling_frequencies_from_timer_resolution() -> None:
    assert parse_timer_resolution("low").sampling_frequency(50000) == 1000
    assert parse_timer_resolution("normal").sampling_frequency(50000) == 10000
    assert parse_timer_resolution("high").sampling_frequency(50000) == 50000
    with pytest.raises(UsageError):
        parse_timer_resolution("cyc=1").sampling_frequency(50000)


def test_empty_targets_refused() -> None:
    with pytest.raises(UsageError):
        Targets(()).argv()


def test_real_perf_accepts_the_sampling_argv(perf_path: str, tmp_path: Path, program) -> None:  # type: ignore[no-untyped-def]
    """perf parses what we build (the run needs no hardware: cpu-clock, a real process).
    The process runs until perf has written its header, then ends, which ends perf: how
    long perf takes to attach on a loaded machine does not matter (a 0.5 s program could
    be gone before perf looked for it)."""
    spin = subprocess.Popen([str(program("spin")), "600"], stdout=subprocess.DEVNULL)
    perf = None
    try:
        argv = sampling_record_argv(
            perf_path,
            SamplingRecordOptions(
                output=tmp_path / "perf.data",
                targets=Targets((spin.pid,)),
                callgraph=CallgraphMode.FP,
                hardware_events=False,
                frequency=1000,
            ),
        )
        perf = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        data = tmp_path / "perf.data"
        deadline = time.monotonic() + 120
        while perf.poll() is None and time.monotonic() < deadline:
            if data.exists() and data.stat().st_size > 0:
                time.sleep(0.5)  # (some samples)
                break
            time.sleep(0.05)
        spin.kill()
        _, stderr = perf.communicate(timeout=120)
        assert perf.returncode == 0, stderr
        assert data.stat().st_size > 0
    finally:
        spin.kill()
        spin.wait()
        if perf is not None and perf.poll() is None:
            perf.kill()
            perf.wait()


def test_the_readme_says_which_timer_resolutions_give_cycle_packets() -> None:
    """The README's list of the presets with cycle-accurate packets is the presets' own."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    text = " ".join(readme.split())
    said = re.search(r"Intel PT `CYC`: on by default, with (.+?), off with (.+?);", text)
    assert said, "the README says which --timer-resolution presets give CYC packets"
    on = set(re.findall(r"`(?:--timer-resolution )?(\w+)`", said[1]))
    off = set(re.findall(r"`(?:--timer-resolution )?(\w+)`", said[2]))
    presets = ("low", "normal", "high")
    assert on == {p for p in presets if parse_timer_resolution(p).uses_cyc}
    assert off == {p for p in presets if not parse_timer_resolution(p).uses_cyc}
    assert NORMAL_TIMER.uses_cyc  # "by default"
