"""What Ctrl-C (and SIGTERM, SIGHUP) means while a program is being recorded.

Both recorders (the perf session and the emulator) stop the program the way the signal
would have, keep what was recorded and decode it. A Ctrl-C typed in the terminal reaches
the program itself (ptscope and the program share the terminal's foreground process
group); a signal sent to ptscope alone is passed on, as the program would have got it.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Final

__all__ = ["STOP_SIGNALS", "terminal_sent_sigint"]

STOP_SIGNALS: Final = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def terminal_sent_sigint() -> bool:
    """Whether ptscope runs in the terminal's foreground group (so its Ctrl-C hit both)."""
    try:
        fd = sys.stdin.fileno()
        return os.isatty(fd) and os.tcgetpgrp(fd) == os.getpgrp()
    except (OSError, ValueError, AttributeError):
        return False
