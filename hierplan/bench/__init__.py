"""Strategy benchmarks: verifiable task suites (generated, and public task sets), one harness,
tables with confidence intervals and tests of significance.

>>> import anyio
>>> from pathlib import Path
>>> from hierplan.bench import BenchConfig, run_bench, summarize
>>> config = BenchConfig(suites=("tot24",), strategies=("react", "dag"), tasks=2)
>>> records = anyio.run(run_bench, config, Path("runs/b"))  # doctest: +SKIP
>>> summarize(records).cells[0].estimates["success"].mean  # doctest: +SKIP
1.0

The command line is ``hierplan bench`` (:mod:`hierplan.cli.bench`).
"""

from __future__ import annotations

from hierplan.bench.base import ActionFailed, BenchTask, Published, Suite, TaskEnv
from hierplan.bench.harness import Admission, BenchConfig, RunGate, load_results, run_bench
from hierplan.bench.paired import PairedRow
from hierplan.bench.plot import plot_cost_success
from hierplan.bench.report import Summary, summarize, write_csv
from hierplan.bench.stats import (
    Estimate,
    cluster_bootstrap,
    holm,
    mcnemar_exact,
    mean_ci,
    paired_difference,
    wilson,
)
from hierplan.bench.suites import SUITE_NAMES, get_suite, suite_names, suites
from hierplan.bench.tables import markdown

__all__ = [
    "SUITE_NAMES",
    "ActionFailed",
    "Admission",
    "BenchConfig",
    "BenchTask",
    "Estimate",
    "PairedRow",
    "Published",
    "RunGate",
    "Suite",
    "Summary",
    "TaskEnv",
    "cluster_bootstrap",
    "get_suite",
    "holm",
    "load_results",
    "markdown",
    "mcnemar_exact",
    "mean_ci",
    "paired_difference",
    "plot_cost_success",
    "run_bench",
    "suite_names",
    "suites",
    "summarize",
    "wilson",
    "write_csv",
]
