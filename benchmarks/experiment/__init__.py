"""Moved to `benchmarks.research.experiment`; this alias keeps the old command running.

`python -m benchmarks.experiment ...` is the command that README, RESULTS and the published
results files (benchmarks/results/experiment-*.md) gave before the re-layout; it runs the
experiment with a warning. New code imports `benchmarks.research.experiment` (CHANGELOG.md).
A package, not a module, so that git still sees the old file as renamed.
"""
