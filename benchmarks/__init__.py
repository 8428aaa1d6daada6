"""The top floor: the front door, speed and reliability scripts, research runs.

`cli.py` is the `tracerl` table and `demo.py` is `tracerl demo` (the front door); `perf/` and
`research/` are scripts, `meta.py` what their records share. Nothing below imports this package
(tests/test_layering.py).
"""
