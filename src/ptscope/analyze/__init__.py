"""Answers from a finished trace: per-function statistics and flame graphs.

Downstream of the write stage: reads ``.fxt(.gz)`` files through
:func:`ptscope.fxt.columns.read_timeline` and never touches recordings or perf.
"""
