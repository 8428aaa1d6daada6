"""`python -m benchmarks.experiment`: the old command of `benchmarks.research.experiment`."""

import runpy
import sys

if __name__ == "__main__":
    print(
        "benchmarks.experiment moved: run `python -m benchmarks.research.experiment` "
        "(same flags); this alias will be removed",
        file=sys.stderr,
    )
    runpy.run_module("benchmarks.research.experiment", run_name="__main__", alter_sys=True)
