"""``ptscope archive RECORDING -o REC.tar.gz``: a recording and every binary it needs,
to decode on another machine (``ptscope decode REC.tar.gz``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["ArchiveCommand"]


class ArchiveCommand:
    name = "archive"
    help = "pack a recording with the binaries it needs (by build-id) into one .tar.gz"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "recording",
            type=Path,
            metavar="RECORDING",
            help="a recording directory (run/attach --keep-recording) or a perf.data",
        )
        parser.add_argument(
            "-o",
            "--output",
            type=Path,
            default=Path("recording.tar.gz"),
            help="archive to write (default recording.tar.gz)",
        )

    def run(self, args: argparse.Namespace) -> int:
        from ptscope.cli.base import check_input, check_output
        from ptscope.perftool import find_perf
        from ptscope.record.archive import create_archive
        from ptscope.recording import Recording

        output = check_output(args.output)
        recording = Recording.find(check_input(args.recording))
        summary = create_archive(recording, output, perf=find_perf())
        for build_id, path, why in summary.missing:
            print(f"ptscope: warning: not archived: {path} ({build_id[:12]}…): {why}",
                  file=sys.stderr)  # fmt: skip
        count = len(summary.objects)
        print(
            f"wrote {output}: the recording and {count} object{'s' * (count != 1)} "
            f"({summary.file_bytes / 1024 / 1024:.1f} MiB); decode it anywhere with: "
            f"ptscope decode {output}",
            file=sys.stderr,
        )
        return 0
