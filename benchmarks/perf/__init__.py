"""Speed and reliability scripts: `python -m benchmarks.perf.NAME`.

Each prints a table, and with `--json` one JSON object as the last line of stdout. They import
the harness through its rooms' faces and `benchmarks.meta`, never `benchmarks.research`; only
`bad_inputs` imports the front door, to run `tracerl` in process.
"""
