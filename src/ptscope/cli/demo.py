"""``ptscope demo``: build the bundled demo program, record it, decode it, summarise."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from ptscope.cli.base import int_between
from ptscope.cli.output import PERFETTO_URL
from ptscope.errors import RecordingError, ToolMissingError

DEMO_FLAGS = ["-O1", "-g", "-fno-omit-frame-pointer"]
MAX_ROUNDS = 1000


def demo_source() -> Path:
    """The bundled demo program's C source (installed with the package)."""
    from importlib import resources  # here: every command imports this module

    with resources.as_file(resources.files("ptscope") / "demo" / "demo.c") as path:
        return Path(path)


def build_demo(cache: Path) -> Path:
    """Compile the demo into ``cache`` (reused while source and flags are unchanged)."""
    import hashlib  # here: loading OpenSSL costs every command a few ms

    source = demo_source()
    compiler = shutil.which(os.environ.get("CC", "gcc"))
    if compiler is None:
        raise ToolMissingError(
            "gcc not found (needed to build the demo program)",
            hint="install it with: sudo apt-get install gcc",
        )
    key = hashlib.sha256(source.read_bytes() + " ".join(DEMO_FLAGS).encode()).hexdigest()[:12]
    binary = cache / f"ptscope-demo-{key}"
    if not binary.exists():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = binary.with_suffix(".tmp")
        result = subprocess.run(
            [compiler, *DEMO_FLAGS, "-o", str(tmp), str(source), "-ldl"],
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            raise RecordingError("could not build the demo program", details=result.stderr)
        tmp.replace(binary)
    return binary


def _default_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ptscope"


class DemoCommand:
    name = "demo"
    help = "record the bundled demo program (dlopen, cos, printf, recursion) into a trace"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "-o",
            "--output",
            type=Path,
            default=Path("demo.fxt.gz"),
            help="trace to write (default demo.fxt.gz)",
        )
        parser.add_argument(
            "--rounds",
            type=int_between(1, MAX_ROUNDS),
            default=3,
            help=f"loop iterations (default 3, at most {MAX_ROUNDS})",
        )
        parser.add_argument(
            "--backend",
            default="auto",
            choices=("auto", "intel-pt", "emulated", "sampling"),
            help="recording backend (default auto: intel-pt if present, else emulated)",
        )
        parser.add_argument(
            "--keep-recording", type=Path, metavar="DIR", help="keep the recording in DIR"
        )

    def run(self, args: argparse.Namespace) -> int:
        from ptscope.cli import main
        from ptscope.cli.run import check_trace_output

        check_trace_output(args.output)
        binary = build_demo(_default_cache())
        print(f"ptscope demo: built {binary.name} from the bundled demo.c", file=sys.stderr)
        argv = ["run", "--backend", args.backend, "-o", str(args.output)]
        if args.keep_recording is not None:
            argv += ["--keep-recording", str(args.keep_recording)]
        if args.verbose:
            argv.append("-" + "v" * args.verbose)
        code = main([*argv, "--", str(binary), str(args.rounds)])
        if code != 0:
            return code
        summarise(args.output)
        return 0


def summarise(trace_path: Path, top: int = 8) -> None:
    """Threads, slices and the functions with the most time in them, from the trace."""
    from ptscope.analyze.calls import format_ns, load_calls
    from ptscope.analyze.stats import function_stats, select_functions

    calls = load_calls(trace_path)
    report = function_stats(calls)
    threads = len(calls.threads)
    print(f"\n{trace_path}: {threads} thread(s), {len(calls):,} slices")
    print(f"  {'function':<40} {'calls':>7} {'time in calls':>14}")
    rows = [f for f in select_functions(report) if not f.name.startswith("[")]
    for f in rows[:top]:
        print(f"  {f.name[:40]:<40} {f.calls:>7,} {format_ns(f.total_ns):>14}")
    print(f"\nOpen it in Perfetto: ptscope serve {trace_path}")
    print(f"  (or open {PERFETTO_URL} and drag the file onto the page)")
    print(
        f"Where the time went: ptscope stats {trace_path}; ptscope flame {trace_path} -o flame.svg"
    )
