"""Speed and reliability scripts: `python -m benchmarks.perf.NAME`.

Each prints a table, and with `--json` one JSON object as the last line of stdout. They may
import `harness.evaluation` and `benchmarks.meta`, never `benchmarks.research`.
"""
