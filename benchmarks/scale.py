"""100,000 leaves in one process: hierplan's peak memory, and its per-leaf time against the
1,000-leaf case (with a bare anyio task group at both sizes as the same-run reference).

    .venv/bin/python benchmarks/scale.py [--small 1000] [--large 100000] [--repeats 5]
        [--large-repeats 1] [--out benchmarks/results]

The workload and the per-leaf figure are those of ``benchmarks/overhead.py`` (a three-level
hierplan tree of 10 ms leaves, budgets on, tracing off; ``(wall - 10 ms) / N``), each run in a
fresh process so that its peak RSS (``ru_maxrss``) is its own. Targets: per-leaf time at the
large size within 1.5x of the small one ("flat"), and peak RSS under 1 GiB at 100,000 leaves.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parent))  # perfkit; last, to shadow nothing
import overhead
import perfkit

GIB_MB = 2**30 / 1e6
FLAT = 1.5


def measure(
    small: int, large: int, repeats: int, large_repeats: int, isolate: bool = True
) -> list[dict[str, Any]]:
    """hierplan and anyio at both sizes; small-size runs alternate, then the large ones."""
    rows: list[dict[str, Any]] = []
    for leaves, times in ((small, repeats), (large, large_repeats)):
        samples: dict[str, list[dict[str, Any]]] = {"hierplan": [], "anyio": []}
        for _ in range(times):
            for impl in samples:
                samples[impl].append(overhead.sample(impl, leaves, isolate))
        rows.extend(overhead.summarise(impl, leaves, s) for impl, s in samples.items())
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Measure, print, and write ``scale.json``; returns what it wrote."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--small", type=int, default=1000)
    parser.add_argument("--large", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5, help="processes at the small size")
    parser.add_argument("--large-repeats", type=int, default=1, help="processes at the large size")
    parser.add_argument("--out", type=Path, default=perfkit.RESULTS, help="scale.json's folder")
    parser.add_argument("--no-out", action="store_true", help="write no JSON")
    parser.add_argument("--in-process", action="store_true", help="no fresh process per run")
    args = parser.parse_args(argv)
    details = perfkit.machine()
    perfkit.print_machine(details)
    rows = measure(
        args.small, args.large, args.repeats, args.large_repeats, isolate=not args.in_process
    )
    at = {(r["impl"], r["leaves"]): r for r in rows}
    growth, growth_cpu = (
        {
            impl: at[impl, args.large][key] / at[impl, args.small][key]
            for impl in ("hierplan", "anyio")
        }
        for key in ("per_leaf_us", "cpu_per_leaf_us")
    )
    print(f"Per-leaf time (wall - 10 ms) / N and peak RSS, {args.small:,} against {args.large:,}")
    body = [
        [
            r["impl"],
            r["leaves"],
            r["per_leaf_us"],
            r["cpu_per_leaf_us"],
            r["wall_s"],
            r["peak_rss_mb"],
        ]
        for r in rows
    ]
    print(perfkit.table(["impl", "N", "µs/leaf", "CPU µs/leaf", "wall s", "peak RSS MB"], body))
    print(
        f"per-leaf growth {args.small:,} -> {args.large:,}: hierplan {growth['hierplan']:.2f}x "
        f"(CPU {growth_cpu['hierplan']:.2f}x), anyio {growth['anyio']:.2f}x "
        f"(CPU {growth_cpu['anyio']:.2f}x); target ≤ {FLAT}x; hierplan peak RSS "
        f"{at['hierplan', args.large]['peak_rss_mb']:.0f} MB (target < {GIB_MB:.0f} MB = 1 GiB)"
    )
    data = {
        "benchmark": "scale",
        "command": "python benchmarks/scale.py " + " ".join(argv or sys.argv[1:]),
        "machine": details,
        "repeats": args.repeats,
        "large_repeats": args.large_repeats,
        "isolated": not args.in_process,
        "small": args.small,
        "large": args.large,
        "rows": rows,
        "per_leaf_growth": growth,
        "cpu_per_leaf_growth": growth_cpu,
        "hierplan_large_peak_rss_mb": at["hierplan", args.large]["peak_rss_mb"],
    }
    perfkit.write_results("scale", data, None if args.no_out else args.out)
    return data


if __name__ == "__main__":
    main()
