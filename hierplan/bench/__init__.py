"""Strategy benchmarks: verifiable task suites, one harness, tables with confidence intervals.

>>> import anyio
>>> from pathlib import Path
>>> from hierplan.bench import BenchConfig, run_bench, summarize
>>> config = BenchConfig(suites=("game24",), strategies=("react", "dag"), tasks=2)
>>> records = anyio.run(run_bench, config, Path("runs/b"))  # doctest: +SKIP
>>> summarize(records).cells[0].estimates["success"].mean  # doctest: +SKIP
1.0

The command line is ``hierplan bench`` (:mod:`hierplan.cli.bench`).
"""

from __future__ import annotations

from hierplan.bench.base import ActionFailed, BenchTask, Suite, TaskEnv
from hierplan.bench.harness import BenchConfig, load_results, run_bench
from hierplan.bench.report import Summary, markdown, plot_cost_success, summarize, write_csv
from hierplan.bench.stats import Estimate, mean_ci, paired_difference, wilson
from hierplan.bench.suites import SUITE_NAMES, get_suite, suites

__all__ = [
    "SUITE_NAMES",
    "ActionFailed",
    "BenchConfig",
    "BenchTask",
    "Estimate",
    "Suite",
    "Summary",
    "TaskEnv",
    "get_suite",
    "load_results",
    "markdown",
    "mean_ci",
    "paired_difference",
    "plot_cost_success",
    "run_bench",
    "suites",
    "summarize",
    "wilson",
    "write_csv",
]
