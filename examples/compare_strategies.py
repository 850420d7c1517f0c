"""Compare ReAct with as-needed decomposition on the crafting suite, from Python.

Runs on the offline simulator (the results are SIMULATED). Run it twice and the second run
resumes: it finds every run already done and only prints the summary.

    python examples/compare_strategies.py
"""

from __future__ import annotations

from pathlib import Path

import anyio

from hierplan.bench import BenchConfig, markdown, run_bench, summarize


async def main(out: Path) -> str:
    """Benchmark two strategies on five crafting tasks and return the Markdown summary."""
    config = BenchConfig(
        suites=("crafting",),
        strategies=("react", "as-needed"),
        tasks=5,
        seeds=2,
        latency_scale=0.0,
    )
    records = await run_bench(config, out, resume=(out / "results.jsonl").exists())
    return markdown(summarize(records, baseline="react"))


if __name__ == "__main__":
    print(anyio.run(main, Path("runs/compare-strategies")))
