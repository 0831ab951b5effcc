"""``ptscope decode``: a recording (or perf script text) → a Fuchsia trace."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ptscope.cli.base import (
    add_decoder_arguments,
    add_recording_argument,
    check_input,
    check_trace_output,
    parse_id_list,
    settle_for_streaming,
    signals_deferred,
)
from ptscope.cli.output import summary_of_incomplete
from ptscope.cli.serve import add_serve_option, serve_in_perfetto
from ptscope.errors import UsageError

if TYPE_CHECKING:
    from ptscope.decode.progress import Progress
    from ptscope.pipeline import DecodeOptions, DecodeSummary
    from ptscope.recording import Recording

# The pipeline (numpy, every stage) is imported when a command runs, not when the CLI
# starts: `ptscope run` must start the workload as soon as perf is ready.


class DecodeCommand:
    name = "decode"
    help = "decode a recording (or perf script text) into a Fuchsia trace"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_recording_argument(parser, optional=True)
        parser.add_argument(
            "--perf-script",
            metavar="FILE",
            help="decode the text of `perf script --ns --itrace=bep -F pid,tid,time,flags,"
            "ip,addr,sym,symoff,synth,dso,event,period` from FILE ('-' for stdin) instead",
        )
        parser.add_argument(
            "-o",
            "--output",
            type=Path,
            default=Path("trace.fxt.gz"),
            help="trace to write; .fxt.gz (default trace.fxt.gz) or .fxt",
        )
        add_serve_option(parser)
        add_decode_options(parser)
        parser.add_argument(
            "--verify",
            action="store_true",
            help="decode with the own decoder and with perf's, and say where they first "
            "differ (exit 1) or that they are identical; writes no trace",
        )

    def run(self, args: argparse.Namespace) -> int:
        from ptscope.decode.perf_launch import early_launches

        if args.verify:
            return verify_decoders(args)
        check_trace_output(args.output)
        with early_launches():
            start_perf_early(args)
            self._decode(args)
        return serve_in_perfetto(args.output) if args.serve else 0

    def _decode(self, args: argparse.Namespace) -> None:
        from ptscope.cli.output import print_summary
        from ptscope.cli.progress import decode_progress

        with signals_deferred():  # (perf may be running already: a signal stops both)
            from ptscope.pipeline import decode_perf_script_text

        options = decode_options(args)
        settle_for_streaming()
        if args.perf_script is not None:
            if args.recording is not None:
                raise UsageError("give either a recording or --perf-script, not both")
            with decode_progress() as progress:
                summary = decode_perf_script_text(
                    args.perf_script, args.output, options, progress=progress
                )
        else:
            if args.recording is None:
                raise UsageError(
                    "what should I decode? give a recording, a perf.data or --perf-script FILE"
                )
            with summary_of_incomplete(), decode_progress() as progress:
                summary = _decode_recording_or_archive(
                    args.recording, args.output, options, progress
                )
        print_summary(summary, sys.stderr, served=args.serve)


def verify_decoders(args: argparse.Namespace) -> int:
    """``ptscope decode --verify``: 0 when both decoders give the same events, else 1
    (the first difference is printed)."""
    from ptscope.decode.verify import describe, differing_fields, verify
    from ptscope.recording import Recording, is_archive

    if args.perf_script is not None or args.recording is None:
        raise UsageError("--verify compares the decoders of a recording: give one")
    path = check_input(Path(args.recording))
    if is_archive(path):
        raise UsageError("--verify takes a recording or a perf.data, not an archive")
    with signals_deferred():
        recording = Recording.find(path)
    verdicts = verify(
        recording.perf_data_paths(),
        pids=parse_id_list(args.pid, "--pid") if args.pid else (),
        tids=parse_id_list(args.tid, "--tid") if args.tid else (),
        symfs=args.symfs,
        insns=args.insn_detail,
        inline=args.inline,
    )
    for v in verdicts:
        if v.difference is None:
            print(
                f"identical: {v.perf_data}: {v.events:,} events ({v.branches:,} branches, "
                f"{v.errors:,} decode errors) from both decoders"
            )
            continue
        d = v.difference
        print(f"different: {v.perf_data}: the decoders part at event {d.index + 1:,}")
        for event in d.before:
            print(f"  both: {describe(event)}")
        print(f"  perf: {describe(d.perf)}")
        print(f"  own:  {describe(d.own)}")
        for line in differing_fields(d.perf, d.own):
            print(f"        {line}")
        return 1
    return 0


def start_perf_early(args: argparse.Namespace) -> None:
    """``ptscope decode``'s recording, if it is one: see :func:`start_decode_early`."""
    from ptscope.errors import PtscopeError
    from ptscope.recording import Recording, is_archive

    if args.perf_script is not None or args.recording is None:
        return
    try:
        path = check_input(Path(args.recording))
        if is_archive(path):
            return  # decoded from a temporary directory, with its own binaries
        recording = Recording.find(path)
        pids = parse_id_list(args.pid, "--pid") if args.pid else ()
        tids = parse_id_list(args.tid, "--tid") if args.tid else ()
    except (PtscopeError, OSError):
        return
    start_decode_early(
        recording,
        decoder=args.decoder,
        jobs=args.jobs,
        pids=pids,
        tids=tids,
        symfs=args.symfs,
        insn_detail=args.insn_detail,
        inline=args.inline,
    )


def start_decode_early(
    recording: Recording,
    *,
    decoder: str,
    jobs: int | None,
    insn_detail: bool,
    inline: bool = False,
    pids: tuple[int, ...] = (),
    tids: tuple[int, ...] = (),
    symfs: Path | None = None,
) -> None:
    """Start the perf of a plain decode (one job, the dlfilter) before the pipeline is
    imported: perf decodes while Python imports numpy, the engine and the writer (0.1 s),
    and the pipeline's reader takes it over (``decode/perf_launch.py``) if it asks for
    the same perf command, as it does when given the same options (the tests check it).
    Any doubt and nothing is started: the pipeline then starts perf itself, and says what
    is wrong. Call it within :func:`~ptscope.decode.perf_launch.early_launches`."""
    from ptscope.decode import perf_launch
    from ptscope.errors import PtscopeError
    from ptscope.perftool import find_perf

    try:
        paths = recording.perf_data_paths()
        # (a recording whose recorder was killed is finished by the pipeline first)
        if (
            not paths
            or recording.backend == "sampling"
            or recording.notes.get("state") == "recording"
        ):
            return
        from ptscope.decode.native_support import holds_stack_samples

        if not recording.backend and holds_stack_samples(paths[0]):
            return  # a `perf record -g` perf.data: decoded as sampled stacks, no dlfilter
        if decoder in ("auto", "native"):
            from ptscope.decode.native_support import is_built, unsupported_reason

            if decoder == "native" or (is_built() and unsupported_reason(paths[0]) is None):
                return  # the own decoder decodes it: no perf
        if perf_launch.decode_jobs(jobs, paths[0]) != 1:
            return
        if inline:
            return  # its perf reads the inlined code's runs, which the pipeline writes
        tool = find_perf()
        if perf_launch.choose_perf_decoder(decoder, tool).name != "dlfilter":
            return
    except (PtscopeError, OSError):
        return
    extra = perf_launch.decode_extra(pids, tids, symfs)
    perf_launch.start_early(
        perf_launch.launch_spec(
            paths[0], tool.path, insns=insn_detail, task_events=True, extra=extra
        )
    )


def _decode_recording_or_archive(
    path: Path, output: Path, options: DecodeOptions, progress: Progress | None = None
) -> DecodeSummary:
    """Decode a recording; an archive is unpacked to a temporary directory first and
    decoded with the binaries it holds (perf's --symfs)."""
    import dataclasses

    from ptscope.children import temporary_directory
    from ptscope.pipeline import decode_recording
    from ptscope.record.archive import is_archive, unpack_archive
    from ptscope.recording import Recording

    check_input(path)
    if not is_archive(path):
        return decode_recording(Recording.find(path), output, options, progress=progress)
    if options.symfs is not None:
        raise UsageError("--symfs does not apply to an archive (it brings its own binaries)")
    with temporary_directory("ptscope-archive-") as tmp:
        unpacked = unpack_archive(path, tmp)
        missing = unpacked.manifest.get("missing") or []
        if isinstance(missing, list) and missing:
            print(
                f"ptscope: warning: {len(missing)} object(s) were not archived; their code "
                "decodes as unknown",
                file=sys.stderr,
            )
        with_binaries = dataclasses.replace(
            options, symfs=unpacked.symfs, kallsyms=unpacked.kallsyms
        )
        return decode_recording(unpacked.recording, output, with_binaries, progress=progress)


def add_decode_options(parser: argparse.ArgumentParser) -> None:
    """Decode options shared by `decode`, `run` and `attach`."""
    group = add_decoder_arguments(parser)
    group.add_argument("--pid", metavar="PID[,PID...]", help="only these processes")
    group.add_argument("--tid", metavar="TID[,TID...]", help="only these threads")
    group.add_argument(
        "--filter",
        dest="region",
        metavar="START,STOP",
        help="keep only what happens between calls of START and STOP",
    )
    group.add_argument("--symfs", type=Path, help="look for binaries under this directory")


def drill_path(args: argparse.Namespace) -> Path | None:
    """The recording each slice's ``drill`` command names: the one decoded (a recording
    directory, a perf.data or an archive: `ptscope insns` takes each), as an absolute path."""
    recording = getattr(args, "recording", None)
    if recording is None or getattr(args, "perf_script", None) is not None:
        return None
    return Path(recording).resolve()


def decode_options(args: argparse.Namespace) -> DecodeOptions:
    from ptscope.pipeline import DecodeOptions
    from ptscope.reconstruct.region_filter import parse_filter

    return DecodeOptions(
        decoder=args.decoder,
        jobs=args.jobs,
        pids=parse_id_list(args.pid, "--pid") if args.pid else (),
        tids=parse_id_list(args.tid, "--tid") if args.tid else (),
        region=parse_filter(args.region) if args.region else None,
        symfs=args.symfs,
        split_size=args.split_size,
        split_time=args.split_time,
        time_axis=args.time_axis,
        insn_detail=args.insn_detail,
        inline=args.inline,
        drill=drill_path(args) if args.drill else None,
    )
