"""`ptscope attach -p PID[,PID...]`: trace running processes until Ctrl-C, a trigger, or
their exit (no ``-p`` on a terminal: pick processes with a fuzzy finder)."""

from __future__ import annotations

import argparse
import os

from ptscope.cli.base import check_trace_output
from ptscope.cli.run import (
    add_record_arguments,
    choose_backend,
    decode_step,
    prepare_session,
    prepare_trigger,
    probe_capabilities,
    region_of,
    report_session,
    require_perf,
)
from ptscope.errors import BadInputError, UsageError

__all__ = ["AttachCommand", "parse_pids"]


def parse_pids(text: str) -> list[int]:
    """``12,34`` → [12, 34]; duplicates and non-numbers are usage errors."""
    try:
        pids = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise UsageError(f"-p {text!r}: expected PIDs separated by commas") from None
    if not pids:
        raise UsageError("-p: no PID given")
    if len(set(pids)) != len(pids):
        raise UsageError(f"-p {text}: a PID is given twice")
    return pids


def _executable(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except FileNotFoundError:
        raise BadInputError(f"no process with PID {pid}") from None
    except PermissionError:
        raise BadInputError(
            f"cannot read the executable of process {pid}: permission denied",
            hint="attach to your own processes, or run as root",
        ) from None
    except OSError as e:
        raise BadInputError(f"process {pid}: {e.strerror}") from None


class AttachCommand:
    name = "attach"
    help = "trace running processes (Ctrl-C takes the snapshot)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "-p", "--pid", metavar="PID[,PID...]", help="processes to trace (default: pick)"
        )
        add_record_arguments(parser, run=False)

    def run(self, args: argparse.Namespace) -> int:
        output = check_trace_output(args.output)
        region_of(args)
        if args.pid:
            pids = parse_pids(args.pid)
        else:
            from ptscope.record.picker import pick_processes

            pids = pick_processes()
        for pid in pids:
            if pid <= 0 or not os.path.isdir(f"/proc/{pid}"):
                raise BadInputError(f"no process with PID {pid}")
        caps = probe_capabilities()
        backend = choose_backend(args.backend, caps.intel_pt.present, run=False)
        trigger = None
        if args.trigger:
            # Symbols come from the first process's executable (and its libraries).
            trigger = prepare_trigger(args.trigger, _executable(pids[0]), pids[0])
        perf_backend, place, options = prepare_session(args, backend, caps, trigger, pids)
        from ptscope.record.session import attach_processes

        with place.recording():
            result = attach_processes(pids, require_perf(caps), perf_backend, options)
        closing = report_session(result, trigger)
        return decode_step(result.recording, output, args, place, closing)
