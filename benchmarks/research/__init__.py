"""Research runs: the headline experiment, the demo's studies, the simulator, the predictor study.

`python -m benchmarks.research.experiment` runs the headline experiment. They import the harness
through its rooms' faces (the demo's job is `harness.evaluation.run_demo`) and `benchmarks.meta`,
never `benchmarks.perf` or the front door (`benchmarks.cli`, `benchmarks.demo`).
"""
