"""Speed and reliability benchmarks: `python -m benchmarks.perf.<name>`."""
