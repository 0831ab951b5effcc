"""A decode interrupted as by Ctrl-C part way (the tests of its threads: the writer's,
the reader's)."""

from __future__ import annotations

from typing import Any

import pytest

from ptscope import pipeline


def interrupt_after_batches(monkeypatch: pytest.MonkeyPatch, batches: int) -> None:
    """Make the next decodes raise KeyboardInterrupt once the engine has fed ``batches``
    batches, where the decoding thread would take Ctrl-C."""
    feed_branches = pipeline._feed_branches
    fed: list[int] = []

    def interrupted(*args: Any) -> None:
        *rest, after = args

        def after_then_stop() -> None:
            after()
            fed.append(1)
            if len(fed) == batches:
                raise KeyboardInterrupt

        feed_branches(*rest, after_then_stop)

    monkeypatch.setattr(pipeline, "_feed_branches", interrupted)
