"""``python -m ptscope``."""

from ptscope.cli import main

raise SystemExit(main())
