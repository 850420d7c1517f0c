"""What the performance benchmarks share: machine details, peak memory, fresh worker processes,
medians, and the JSON results they write (``benchmarks/results/<name>.json``).

Not a benchmark itself. The scripts import it from their own directory, so each of them runs
as ``python benchmarks/<name>.py`` from any directory, against whichever hierplan the Python
environment imports (this checkout or another one).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
PACKAGES = ("hierplan", "anyio", "pydantic", "networkx", "opentelemetry-sdk", "langgraph")


def version(package: str) -> str | None:
    """The installed version of ``package``, or ``None``."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git(where: Path, *args: str) -> str | None:
    try:
        found = subprocess.run(
            ["git", "-C", str(where), *args],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return found.stdout.strip() if found.returncode == 0 else None


def hierplan_source() -> dict[str, Any]:
    """Which hierplan code is measured: the checkout's commit, the last commit that changed
    the package, and whether the package has uncommitted changes (``None``: not in git)."""
    try:
        import hierplan
    except ImportError:
        return {"commit": None, "package_commit": None, "package_dirty": None}
    where = Path(hierplan.__file__).resolve().parent
    status = _git(where, "status", "--porcelain", "--", ".")
    return {
        "commit": _git(where, "rev-parse", "--short", "HEAD") or None,
        "package_commit": _git(where, "log", "-1", "--format=%h", "--", ".") or None,
        "package_dirty": None if status is None else bool(status),
    }


def machine() -> dict[str, Any]:
    """Where the figures come from: CPUs, load, Python, platform and package versions."""
    try:
        load: list[float] | None = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    source = hierplan_source()
    return {
        "cpus": os.cpu_count(),
        "load_avg": load,
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "packages": {name: version(name) for name in PACKAGES},
        "hierplan_commit": source["commit"],
        "hierplan_package_commit": source["package_commit"],
        "hierplan_package_dirty": source["package_dirty"],
        "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }


def print_machine(details: dict[str, Any]) -> None:
    """One readable paragraph of :func:`machine`."""
    packages = ", ".join(f"{k} {v or 'not installed'}" for k, v in details["packages"].items())
    print(
        f"{details['platform']}, {details['implementation']} {details['python']}, "
        f"{details['cpus']} CPU(s), load {details['load_avg']}, hierplan commit "
        f"{details['hierplan_commit'] or 'unknown'} (package last changed in "
        f"{details.get('hierplan_package_commit') or 'unknown'}"
        f"{', with uncommitted changes' if details.get('hierplan_package_dirty') else ''})"
        f"\n{packages}\n"
    )


def peak_rss_mb() -> float:
    """This process's peak resident set size so far, in MB (10^6 bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB on Linux
    return peak * scale / 1e6


def current_rss_mb() -> float | None:
    """This process's resident set size now, in MB (Linux only; ``None`` elsewhere)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / 1e6


def run_worker(script: Path, spec: dict[str, Any], timeout_s: float = 1800) -> dict[str, Any]:
    """Run ``script --worker SPEC`` in a fresh interpreter and return the JSON it prints last.

    A fresh process per configuration keeps one configuration's peak memory (and its heap,
    caches and garbage) out of another's figures.
    """
    found = subprocess.run(
        [sys.executable, str(script), "--worker", json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if found.returncode != 0:
        raise RuntimeError(
            f"worker {script.name} {spec} failed (exit {found.returncode}):\n{found.stderr[-4000:]}"
        )
    return dict(json.loads(found.stdout.strip().splitlines()[-1]))


def median(values: Sequence[float]) -> float:
    """The median (the figure every table reports; the samples are kept in the JSON too)."""
    return float(statistics.median(values))


def write_results(name: str, data: dict[str, Any], out: Path | None) -> Path | None:
    """Write ``data`` as ``<out>/<name>.json`` (``out`` ``None``: write nothing)."""
    if out is None:
        return None
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def leaves_parser(doc: str | None, leaves: int, repeats: int) -> argparse.ArgumentParser:
    """The options of a script measuring one workload: ``--leaves``, ``--repeats``, and where to
    write its JSON (``--out DIR``, or ``--no-out``)."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    parser.add_argument("--leaves", type=int, default=leaves)
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--no-out", dest="out", action="store_const", const=None)
    return parser


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain-text table with right-aligned columns (the first one left-aligned)."""
    cells = [[str(h) for h in headers], *[[_cell(c) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        parts = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)
        ]
        lines.append("  ".join(parts))
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.2f}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)
