"""A stand-in for perf (see ``support.faults.standin_perf``): every command is the real
perf's (``PTSCOPE_REAL_PERF``) except ``perf script``, which, as ``STANDIN_MODE`` says,
``hangs`` at once (no output), or ``decodes-then-hangs``: runs the real ``perf script``
(with every file descriptor, the dlfilter's beat pipe included) and then hangs with its
output still open, as a perf stuck after decoding part of a recording would."""

from __future__ import annotations

import os
import subprocess
import sys
import time

real = os.environ["PTSCOPE_REAL_PERF"]
args = sys.argv[1:]
if not args or args[0] != "script":
    os.execv(real, [real, *args])
if os.environ.get("STANDIN_MODE") == "decodes-then-hangs":
    subprocess.run([real, *args], close_fds=False, check=False)
    sys.stdout.flush()
while True:
    time.sleep(3600)
