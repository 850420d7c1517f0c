"""Write the results tables of ``benchmarks/README.md`` from the benchmarks' JSON results.

    .venv/bin/python benchmarks/report.py [--results benchmarks/results]
        [--before benchmarks/results/before] [--readme benchmarks/README.md]

Each benchmark's latest figures (``results/<name>.json``, written by ``make bench``) stand next
to the baseline kept in ``results/before/<name>.json`` (the figures of the code before the
performance work). The tables replace what is between the ``<!-- results:start -->`` and
``<!-- results:end -->`` markers; the rest of the README is left as written. Before and
current figures come from different runs of a shared machine: compare their ratios (each
measured within one run), not their absolute times.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
START, END = "<!-- results:start -->", "<!-- results:end -->"
NAMES = ("overhead", "instructions", "memory", "makespan", "scale", "tracing")
Data = dict[str, Any] | None


def load(folder: Path, name: str) -> Data:
    """``<folder>/<name>.json``, or ``None`` when that benchmark has not been run."""
    path = folder / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def fmt(value: Any, digits: int = 0) -> str:
    """A table cell: ``—`` for a missing figure."""
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def grid(headers: list[str], rows: list[list[str]]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _label(data: Data) -> str:
    if data is None:
        return "not run"
    machine = data["machine"]
    package = machine.get("hierplan_package_commit")
    source = f"hierplan package as of {package}" if package else "hierplan"
    if machine.get("hierplan_package_dirty"):
        source += " with uncommitted changes"
    return (
        f"{source} (checkout {machine.get('hierplan_commit') or '?'}), "
        f"{machine['when']}, {machine['cpus']} CPUs (load {machine.get('load_avg')}), "
        f"Python {machine['python']}"
    )


def _row(data: Data, impl: str, leaves: int) -> dict[str, Any]:
    for row in (data or {}).get("rows", []):
        if row["impl"] == impl and row["leaves"] == leaves and row.get("available", True):
            return dict(row)
    return {}


def overhead(before: Data, now: Data) -> str:
    """Per-leaf µs, RSS and ratios, before and now."""
    sizes = sorted({r["leaves"] for d in (before, now) if d for r in d["rows"]})
    rows = []
    for leaves in sizes:
        for impl in ("hierplan", "anyio", "langgraph"):
            b, n = _row(before, impl, leaves), _row(now, impl, leaves)
            rows.append(
                [
                    fmt(leaves),
                    impl,
                    fmt(b.get("per_leaf_us")),
                    fmt(n.get("per_leaf_us")),
                    fmt(b.get("cpu_per_leaf_us")),
                    fmt(n.get("cpu_per_leaf_us")),
                    fmt(b.get("peak_rss_mb")),
                    fmt(n.get("peak_rss_mb")),
                ]
            )
    headers = [
        "N",
        "impl",
        "µs/leaf before",
        "now",
        "CPU µs/leaf before",
        "now",
        "peak RSS MB before",
        "now",
    ]
    ratio_rows = []
    for leaves in sizes:
        b = next((r for r in (before or {}).get("ratios", []) if r["leaves"] == leaves), {})
        n = next((r for r in (now or {}).get("ratios", []) if r["leaves"] == leaves), {})
        keys = (
            "hierplan_vs_anyio",
            "hierplan_vs_anyio_cpu",
            "langgraph_vs_hierplan",
            "langgraph_vs_hierplan_cpu",
        )
        ratio_rows.append([fmt(leaves)] + [fmt(d.get(k), 2) for k in keys for d in (b, n)])
    ratio_headers = [
        "N",
        "hierplan / anyio before",
        "now",
        "(CPU) before",
        "now",
        "LangGraph / hierplan before",
        "now",
        "(CPU) before",
        "now",
    ]
    return (
        "### overhead\n\nPer-leaf overhead `(wall - 10 ms) / N`, and the process's CPU time / N. "
        "Targets: hierplan / anyio ≤ 1.5; LangGraph / hierplan ≥ 10 at N = 5,000.\n\n"
        + grid(headers, rows)
        + "\n\n"
        + grid(ratio_headers, ratio_rows)
    )


def makespan(before: Data, now: Data) -> str:
    """Makespan / bound per DAG shape, before and now, with the anyio reference."""
    keyed: dict[tuple[int, int], dict[str, Any]] = {}
    for which, data in (("before", before), ("now", now)):
        for row in (data or {}).get("rows", []):
            keyed.setdefault((row["width"], row["depth"]), {})[which] = row
    rows = []
    for (width, depth), both in sorted(keyed.items()):
        b, n = both.get("before", {}), both.get("now", {})
        rows.append(
            [
                f"{width} × {depth}",
                fmt((n or b).get("bound_s", 0) * 1e3),
                fmt(b.get("hierplan", {}).get("ratio"), 3),
                fmt(n.get("hierplan", {}).get("ratio"), 3),
                fmt(b.get("anyio", {}).get("ratio"), 3),
                fmt(n.get("anyio", {}).get("ratio"), 3),
            ]
        )
    headers = [
        "width × depth",
        "bound ms",
        "hierplan before",
        "now",
        "anyio runner before",
        "now",
    ]
    return "### makespan\n\nMakespan / critical-path bound; target ≤ 1.05.\n\n" + grid(
        headers, rows
    )


def scale(before: Data, now: Data) -> str:
    """Per-leaf time at both sizes, growth and peak RSS, before and now."""
    rows = []
    for label, data in (("before", before), ("now", now)):
        if data is None:
            rows.append([label] + ["—"] * 9)
            continue
        small, large = data["small"], data["large"]
        hp_s, hp_l = _row(data, "hierplan", small), _row(data, "hierplan", large)
        cpu_growth = data.get("cpu_per_leaf_growth", {})
        rows.append(
            [
                label,
                fmt(hp_s.get("per_leaf_us")),
                fmt(hp_l.get("per_leaf_us")),
                fmt(data["per_leaf_growth"]["hierplan"], 2),
                fmt(cpu_growth.get("hierplan"), 2),
                fmt(data["per_leaf_growth"]["anyio"], 2),
                fmt(cpu_growth.get("anyio"), 2),
                fmt(hp_l.get("peak_rss_mb")),
                fmt(_row(data, "anyio", large).get("peak_rss_mb")),
                fmt(hp_l.get("wall_s"), 1),
            ]
        )
    sizes = (
        f"{(now or before or {}).get('small', 1000):,} → {(now or before or {}).get('large', 0):,}"
    )
    headers = [
        "",
        "hierplan µs/leaf small",
        "large",
        "growth hierplan",
        "(CPU)",
        "growth anyio",
        "(CPU)",
        "peak RSS MB hierplan",
        "anyio",
        "hierplan large run s",
    ]
    return (
        f"### scale\n\nLeaves {sizes}. Targets: per-leaf growth ≤ 1.5 (flat), peak RSS under "
        "1 GiB (1,074 MB).\n\n" + grid(headers, rows)
    )


def tracing(before: Data, now: Data) -> str:
    """Tracing overhead per leaf for each configuration, before and now."""
    rows = []
    for config in ("api", "sdk-traces", "sdk", "sdk-replay", "sdk-floor"):
        b = (before or {}).get(config, {})
        n = (now or {}).get(config, {})
        keys = (("overhead_us_per_leaf", 1), ("cpu_overhead_us_per_leaf", 1), ("ratio", 2))
        rows.append([config] + [fmt(d.get(k), digits) for k, digits in keys for d in (b, n)])
    off = [fmt((d or {}).get("off", {}).get("per_leaf_us"), 1) for d in (before, now)]
    headers = [
        "config",
        "µs/leaf added before",
        "now",
        "CPU µs/leaf added before",
        "now",
        "run / off before",
        "now",
    ]
    return (
        "### tracing\n\nTarget: `sdk` adds ≤ 60 µs per leaf. `sdk-floor` is the SDK alone creating "
        "the run's spans in a bare loop (the least any instrumentation emitting them can add); "
        "`sdk-replay` emits them through hierplan's instrument seam and does nothing else. "
        "Tracing off costs "
        f"{off[0]} µs per leaf before, {off[1]} now.\n\n" + grid(headers, rows)
    )


def instructions(before: Data, now: Data) -> str:
    """Instructions per leaf of each implementation, and their ratios, before and now."""
    rows = []
    for impl, label in (
        ("hierplan", "hierplan"),
        ("hierplan-direct", "hierplan, tool-only leaf"),
        ("anyio", "anyio"),
        ("langgraph", "langgraph"),
    ):
        cells = [
            fmt(_row(d, impl, (d or {}).get("leaves", 0)).get("per_leaf")) for d in (before, now)
        ]
        rows.append([label, *cells])
    for label, key in (
        ("hierplan / anyio", "hierplan_over_anyio"),
        ("tool-only leaf / model leaf", "hierplan_direct_over_hierplan"),
        ("LangGraph / hierplan", "langgraph_over_hierplan"),
    ):
        rows.append([label, *[fmt((d or {}).get("ratios", {}).get(key), 2) for d in (before, now)]])
    leaves = (now or before or {}).get("leaves", 1000)
    return (
        f"### instructions\n\nThe overhead workload at {leaves:,} leaves, counted in CPU "
        "instructions per leaf under valgrind (the same on a loaded machine as on an idle one); "
        "a tool-only leaf is a step with a tool and its arguments, which makes no model call. "
        "Targets: hierplan / anyio ≤ 2.0; a tool-only leaf ≤ 0.6 of a model leaf. A figure "
        "not measured in a column's run (no tool-only workload before) is —.\n\n"
        + grid(["", "instructions/leaf before", "now"], rows)
    )


def memory(before: Data, now: Data) -> str:
    """What a leaf holds while it waits, before and now."""
    rows = [
        [label, *[fmt((d or {}).get(key), digits) for d in (before, now)]]
        for label, key, digits in (
            ("GC-tracked objects alive per leaf in flight, hierplan", "objects", 1),
            ("the same, bare anyio task", "anyio_objects", 1),
            ("hierplan / anyio", "objects_over_anyio", 2),
            ("bytes per leaf in flight, hierplan", "in_flight_bytes", 0),
            ("bytes per leaf after the run (the record)", "after_bytes", 0),
            ("bytes per bare anyio task in flight", "anyio_in_flight_bytes", 0),
        )
    ]
    leaves = (now or before or {}).get("leaves", 10_000)
    return (
        f"### memory\n\n{leaves:,} leaves, every one in flight at once (tracemalloc, and the "
        "objects the garbage collector tracks, which each of its passes walks). Target: "
        "≤ 40 GC-tracked objects a leaf. Not measured before the performance work: —.\n\n"
        + grid(["", "before", "now"], rows)
    )


SECTIONS: dict[str, Callable[[Data, Data], str]] = {
    "overhead": overhead,
    "instructions": instructions,
    "memory": memory,
    "makespan": makespan,
    "scale": scale,
    "tracing": tracing,
}


def render(results: Path, before: Path) -> str:
    """Every section, with where each column's figures come from."""
    parts = []
    for name, section in SECTIONS.items():
        old, new = load(before, name), load(results, name)
        command = (new or old or {}).get("command", f"python benchmarks/{name}.py")
        sources = f"- before: {_label(old)}\n- now: {_label(new)}"
        parts.append(f"{section(old, new)}\n\n`{command.strip()}`\n\n{sources}")
    return "\n\n".join(parts)


def update(readme: Path, text: str) -> None:
    """Replace what is between the markers of ``readme`` with ``text``."""
    current = readme.read_text()
    if START not in current or END not in current:
        raise SystemExit(f"{readme} has no {START} ... {END} markers to write the tables between")
    pattern = re.compile(re.escape(START) + ".*?" + re.escape(END), re.S)
    readme.write_text(pattern.sub(lambda _: f"{START}\n\n{text}\n\n{END}", current, count=1))


def main(argv: list[str] | None = None) -> str:
    """Render the tables into the README; returns them."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=HERE / "results")
    parser.add_argument("--before", type=Path, default=HERE / "results" / "before")
    parser.add_argument("--readme", type=Path, default=HERE / "README.md")
    args = parser.parse_args(argv)
    text = render(args.results, args.before)
    update(args.readme, text)
    print(f"wrote the results tables of {args.readme}")
    return text


if __name__ == "__main__":
    main()
