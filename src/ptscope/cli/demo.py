"""``ptscope demo``: build the bundled demo program, record it, decode it, summarise."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from ptscope.cli.base import check_trace_output, int_between
from ptscope.cli.output import PERFETTO_URL
from ptscope.errors import RecordingError, ToolMissingError

DEMO_FLAGS = ["-O1", "-g", "-fno-omit-frame-pointer"]
MAX_ROUNDS = 1000


def demo_source() -> Path:
    """The bundled demo program's C source (installed with the package)."""
    from importlib import resources  # here: every command imports this module

    with resources.as_file(resources.files("ptscope") / "demo" / "demo.c") as path:
        return Path(path)


def build_demo(cache: Path, *, variant: bool = False) -> Path:
    """Compile the demo into ``cache`` (reused while source and flags are unchanged);
    ``variant``: the one whose sum() runs an extra loop."""
    import hashlib  # here: loading OpenSSL costs every command a few ms

    source = demo_source()
    compiler = shutil.which(os.environ.get("CC", "gcc"))
    if compiler is None:
        raise ToolMissingError(
            "gcc not found (needed to build the demo program)",
            hint="install it with: sudo apt-get install gcc",
        )
    flags = [*DEMO_FLAGS, *(["-DPTSCOPE_DEMO_VARIANT"] if variant else [])]
    key = hashlib.sha256(source.read_bytes() + " ".join(flags).encode()).hexdigest()[:12]
    # One directory per build, the same file name in each: the variant's trace names
    # its binary as the demo's does (`[unknown] (.../ptscope-demo)` rows then match).
    binary = cache / f"demo-{key}" / "ptscope-demo"
    if not binary.exists():
        binary.parent.mkdir(parents=True, exist_ok=True)
        tmp = binary.with_suffix(".tmp")
        result = subprocess.run(
            [compiler, *flags, "-o", str(tmp), str(source), "-ldl"],
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            raise RecordingError("could not build the demo program", details=result.stderr)
        tmp.replace(binary)
    return binary


def variant_output(output: Path) -> Path:
    """``demo.fxt.gz`` -> ``demo-variant.fxt.gz`` (beside it)."""
    name = output.name
    for suffix in (".fxt.gz", ".fxt"):
        if name.endswith(suffix):
            return output.with_name(f"{name[: -len(suffix)]}-variant{suffix}")
    return output.with_name(f"{name}-variant")


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
        parser.add_argument(
            "--no-diff",
            action="store_true",
            help="do not also record the variant (an extra loop in sum) and diff the two",
        )

    def run(self, args: argparse.Namespace) -> int:
        from ptscope.cli import main
        from ptscope.cli.run import choose_backend, probe_capabilities

        check_trace_output(args.output)
        binary = build_demo(_default_cache())
        print(f"ptscope demo: built {binary} from the bundled demo.c", file=sys.stderr)
        backend = choose_backend(args.backend, probe_capabilities().intel_pt.present, run=True)
        argv = ["run", "--backend", backend, "-o", str(args.output)]
        if backend == "emulated":
            argv.append("--deterministic")  # so that the diff below shows only the change
        if args.verbose:
            argv.append("-" + "v" * args.verbose)
        keep = [] if args.keep_recording is None else ["--keep-recording", str(args.keep_recording)]
        code = main([*argv, *keep, "--", str(binary), str(args.rounds)])
        if code != 0:
            return code
        summarise(args.output)
        if args.no_diff or backend == "sampling":  # samples count no instructions
            return 0
        variant = build_demo(_default_cache(), variant=True)
        after = variant_output(args.output)
        argv[argv.index("-o") + 1] = str(after)
        print(f"\nptscope demo: the variant (sum() runs an extra loop) into {after}", flush=True)
        code = main([*argv, "--", str(variant), str(args.rounds)])
        if code != 0:
            return code
        print(f"\n$ ptscope diff {args.output} {after} --changed --top 6", flush=True)
        return main(["diff", str(args.output), str(after), "--changed", "--top", "6"])


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
