"""Time to a run's first tool call, from the run records a ``hierplan bench --save-runs`` wrote.

    hierplan bench --suite parallel_qa --strategies dag,react --tasks 6 --seeds 1 \\
        --sim-profile typical --sim-latency-scale 1 --save-runs --no-plot -o OUT
    .venv/bin/python benchmarks/first_tool_call.py OUT

For each strategy, the means over its runs of:

- ``first tool s``: from the run's start to the start of its first tool call;
- ``first line s``: from the run's start to when the first step's line of the root plan was read
  (``parsed_at``): the planner's time to its first token plus the time to write that line
  (streamed plans only; ``-`` when the plan was not streamed);
- ``tool after line ms``: the first tool call's start after that line was read (streamed
  plans only);
- ``planning call s``: the root's first planning call, start to end;
- ``latency s``: the run's start to its end.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any


def _nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    out = [node]
    for child in node.get("children", []):
        out.extend(_nodes(child))
    return out


def figures(run: dict[str, Any]) -> dict[str, float | None]:
    """One run's figures (see the module docstring)."""
    start = run["started_at"]
    tree = run["tree"]
    tools = [t["started_at"] for n in _nodes(tree) for t in n.get("tool_calls", [])]
    parsed = [c.get("parsed_at") for c in tree.get("children", []) if c.get("parsed_at")]
    planning = [c for c in tree.get("calls", []) if c["phase"] == "planning"]
    return {
        "first tool s": min(tools) - start if tools else None,
        "first line s": min(parsed) - start if parsed else None,
        "tool after line ms": (min(tools) - min(parsed)) * 1000 if tools and parsed else None,
        "planning call s": planning[0]["duration_s"] if planning else None,
        "latency s": run["finished_at"] - start,
    }


def _mean(values: list[float | None]) -> str:
    known = [v for v in values if v is not None]
    return f"{statistics.fmean(known):.3f}" if known else "-"


def main(out: Path) -> None:
    """Print the table of the bench in ``out``."""
    by_strategy: dict[str, list[dict[str, float | None]]] = defaultdict(list)
    for path in sorted((out / "runs").glob("*/run.json")):
        run = json.loads(path.read_text())
        by_strategy[run["strategy"]].append(figures(run))
    columns = ["first tool s", "first line s", "tool after line ms", "planning call s", "latency s"]
    print("| strategy | runs | " + " | ".join(columns) + " |")
    print("|---|---|" + "---|" * len(columns))
    for strategy, runs in sorted(by_strategy.items()):
        cells = [_mean([r[c] for r in runs]) for c in columns]
        print(f"| {strategy} | {len(runs)} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
