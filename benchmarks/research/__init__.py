"""Research runs: the demo, the headline experiment, the allocation simulator, the predictor study.

`tracerl demo` runs the demo; `python -m benchmarks.research.experiment` the headline
experiment. They may import `harness.evaluation` and `benchmarks.meta`, never `benchmarks.perf`.
"""
