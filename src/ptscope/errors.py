"""User-facing errors: one clear line for the user, details for ``-v``.

Every failure a user can cause or meet (missing file, missing tool, bad recording) is a
:class:`PtscopeError`; the CLI prints ``ptscope: error: <message>`` and exits with
``exit_code``. Anything else reaching the CLI is a bug and is reported as such.
"""

from __future__ import annotations

__all__ = [
    "BadInputError",
    "PtscopeError",
    "RecordingError",
    "ScratchSpaceError",
    "Terminated",
    "ToolMissingError",
    "UsageError",
]


class PtscopeError(Exception):
    """An error to show the user as one line.

    ``details`` is extra text printed only with ``-v``; ``hint`` is a second line telling
    the user what to do (printed always, when given).
    """

    exit_code: int = 1

    def __init__(
        self,
        message: str,
        *,
        details: str | None = None,
        hint: str | None = None,
        exit_code: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.details = details
        self.hint = hint
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(PtscopeError):
    """The command line does not make sense."""

    exit_code = 2


class BadInputError(PtscopeError):
    """An input file is missing, unreadable or not what it should be."""

    exit_code = 3


class ToolMissingError(PtscopeError):
    """A required external tool (perf, qemu-x86_64, a compiler) is missing or too old."""

    exit_code = 4


class RecordingError(PtscopeError):
    """Recording failed (the program, perf or the emulator did not do what was asked)."""

    exit_code = 5


class ScratchSpaceError(PtscopeError):
    """ptscope's temporary files (in TMPDIR) could not be written: a full disk, a quota, the
    file size limit. Not the recording's fault: a decode that meets it stops, and keeps no
    half trace."""


class Terminated(BaseException):
    """ptscope got ``SIGTERM`` or ``SIGHUP`` (the CLI raises it from the signal's handler):
    like Ctrl-C's ``KeyboardInterrupt``, it unwinds everything, so that children are
    stopped and temporary files removed on the way out, and the recording is kept."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
