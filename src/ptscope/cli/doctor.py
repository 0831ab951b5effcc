"""`ptscope doctor`: what this machine can record with, and how to fix what is missing."""

from __future__ import annotations

import argparse

from ptscope.cli.run import probe_capabilities

__all__ = ["DoctorCommand"]


class DoctorCommand:
    name = "doctor"
    help = "check perf, Intel PT, privileges, QEMU and the dlfilter; say how to fix gaps"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        pass

    def run(self, args: argparse.Namespace) -> int:
        from ptscope.record.doctor import Status, diagnose, render

        findings = diagnose(probe_capabilities())
        print(render(findings))
        missing = [f.topic for f in findings if f.status is Status.MISSING]
        can_record = (
            any(
                f.topic in ("intel_pt", "qemu") and f.status is not Status.MISSING for f in findings
            )
            and "perf" not in missing
        )
        if can_record:
            print("\nptscope can record on this machine.")
        else:
            print("\nptscope cannot record here yet: see the fixes above.")
        return 0 if can_record else 1
