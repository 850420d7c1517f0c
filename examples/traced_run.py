"""Run the data-migration scenario with tracing, then write the HTML report of the run.

    python examples/traced_run.py [TARGET ...]

Each TARGET is a ``--trace`` value (``console``, ``otlp``, ``otlp=URL``, ``jsonl=PATH``);
without one the spans go to the console. The run record and report go to runs/traced/.
"""

from __future__ import annotations

import sys
from pathlib import Path

import hierplan
from hierplan.tracing.setup import configure_tracing
from hierplan.view import write_html


def main(targets: list[str]) -> int:
    out = Path("runs/traced")
    setup = configure_tracing(targets or ["console"])  # None only without any target
    assert setup is not None
    with setup as tracing:
        result = hierplan.run_sync(
            scenario="data_migration",
            workdir=out,
            instruments=tracing.instruments,
            model=hierplan.Simulator(latency_scale=0),
        )
    result.write(out / "run.json")
    report = write_html(result, out / "report.html")
    print(f"{result.status}: cost ${result.totals()['cost_usd']:.4f}; report {report}")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
