"""``python -m ptscope``."""

from ptscope.cli import run

run()
