"""How long hierplan takes to start: ``import hierplan`` and ``hierplan --help`` against a bare
interpreter, as ratios measured in one run.

    .venv/bin/python benchmarks/startup.py [--repeats 21] [--no-out]

Each repeat starts three fresh processes, one after the other, in the same order every time:

- ``python -c pass``: the interpreter alone (with the environment's ``site``), the baseline;
- ``python -c "import hierplan"``: the package;
- ``hierplan --help``: the console script next to the interpreter (``python -m hierplan
  --help`` where there is none), which builds the whole command line to print its help.

Taking the three in turn, rather than all of one before the next, exposes each to the same
moments of a machine whose load changes; the figures are the median wall time of each, and the
two ratios (each command's median over the baseline's) are what to compare between machines.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parent))  # perfkit; last
import perfkit


def commands() -> dict[str, list[str]]:
    """The three command lines measured, by name."""
    script = Path(sys.executable).with_name("hierplan")
    help_command = [str(script)] if script.exists() else [sys.executable, "-m", "hierplan"]
    return {
        "python -c pass": [sys.executable, "-c", "pass"],
        "import hierplan": [sys.executable, "-c", "import hierplan"],
        "hierplan --help": [*help_command, "--help"],
    }


def wall_time(command: Sequence[str]) -> float:
    """Seconds from starting ``command`` to its exit; a failing command stops the benchmark."""
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, check=False)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed (exit {done.returncode}):\n{done.stderr!r}")
    return elapsed


def measure(repeats: int) -> dict[str, Any]:
    """The samples, medians (ms) and ratios over the baseline of the three commands."""
    measured = commands()
    for command in measured.values():  # warm-up: the files in the page cache, .pyc written
        wall_time(command)
    samples: dict[str, list[float]] = {name: [] for name in measured}
    for _ in range(repeats):
        for name, command in measured.items():
            samples[name].append(wall_time(command))
    median_ms = {name: perfkit.median(v) * 1e3 for name, v in samples.items()}
    base = median_ms["python -c pass"]
    return {
        "repeats": repeats,
        "commands": {name: list(command) for name, command in measured.items()},
        "median_ms": median_ms,
        "ratio": {
            "import hierplan": median_ms["import hierplan"] / base,
            "hierplan --help": median_ms["hierplan --help"] / base,
        },
        "samples_s": samples,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Measure, print, write ``startup.json``; returns the figures."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--out", type=Path, default=perfkit.RESULTS)
    parser.add_argument("--no-out", dest="out", action="store_const", const=None)
    args = parser.parse_args(argv)
    details = perfkit.machine()
    perfkit.print_machine(details)
    data = {"machine": details, **measure(args.repeats)}
    ratio = data["ratio"]
    rows = [(name, ms, ratio.get(name, 1.0)) for name, ms in data["median_ms"].items()]
    print(f"median of {args.repeats} runs of each, interleaved")
    print(perfkit.table(["command", "ms", "× python -c pass"], rows))
    perfkit.write_results("startup", data, args.out)
    return data


if __name__ == "__main__":
    main()
