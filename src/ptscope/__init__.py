"""ptscope: every function call a native program made, on a zoomable timeline.

Records a branch trace (Intel PT, emulated Intel PT, or stack samples) with Linux ``perf``,
rebuilds exact call stacks and writes a Fuchsia trace that the Perfetto UI opens.
See ``docs/architecture.md`` for the pipeline.
"""

__version__ = "0.1.0"
