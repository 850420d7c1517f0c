"""How fast a consumer reads a run's events, and what an attached consumer costs the run.

    .venv/bin/python benchmarks/events.py [--leaves 2000] [--repeat 7]

The run: one plan of ``--leaves`` independent steps, each calling a no-op async tool directly
(no model calls), so that the orchestration and the events are all there is to measure. Each
leaf makes three events (node started, tool called, node finished).

Figures, all measured in this process, in the same run of this script:

- overhead: the median wall time of the run with a handle and a consumer reading every event
  concurrently, divided by the median wall time of the same run with no listener at all
  (repetitions interleaved). Also with a consumer that turns every event into JSON, as the
  example service does for server-sent events.
- read rate: events per second a consumer reads from a handle's buffer (after the run, so the
  producer does not bound it), plain and as JSON.
- live lag: how many events were still unread when the run finished (a consumer that keeps up
  has none).
- memory: bytes the handle's buffer holds per event (tracemalloc).

After the warm-up the objects then alive are frozen out of garbage collection (``gc.freeze``),
so that a full collection of the interpreter's own heap, which may or may not fall inside a
0.1 s run, does not decide the comparison; what the runs allocate is still collected.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

import hierplan
from hierplan import Plan, RunSettings, ScriptedModel, Step, tool
from hierplan.models.scripted import plan_response


@tool
async def noop(i: int) -> int:
    """Do nothing."""
    return i


def _plan(leaves: int) -> Plan:
    steps = [
        Step(id=f"s{i}", title=f"step {i}", instruction="no-op", tool="noop", args={"i": i})
        for i in range(leaves)
    ]
    return Plan(goal="many leaves", steps=steps)


def _options(leaves: int) -> dict[str, Any]:
    return {
        "model": ScriptedModel([plan_response(_plan(leaves))]),
        "tools": [noop],
        "strategy": "dag",
        "settings": RunSettings(
            strategy="dag", max_steps=leaves, concurrency=64, plan_concurrency=64
        ),
    }


async def bare(leaves: int) -> float:
    """The run with nobody listening."""
    t0 = time.perf_counter()
    result = await hierplan.run("many leaves", **_options(leaves))
    assert result.status == "succeeded"
    return time.perf_counter() - t0


async def _watched(leaves: int, as_json: bool) -> tuple[float, int, int]:
    t0 = time.perf_counter()
    read = 0
    lag = 0
    async with hierplan.start("many leaves", **_options(leaves)) as handle:
        async for event in handle.events():
            if as_json:
                event.model_dump_json()
            read += 1
            if event.type == "run_finished":
                lag = handle.event_count - read
        result = await handle.result()
    assert result.status == "succeeded"
    return time.perf_counter() - t0, read, lag


async def consumed(leaves: int) -> float:
    """The run with a handle and a consumer reading every event."""
    return (await _watched(leaves, False))[0]


async def consumed_json(leaves: int) -> float:
    """The same, the consumer serialising each event to JSON."""
    return (await _watched(leaves, True))[0]


async def read_rate(leaves: int) -> dict[str, float]:
    """Events per second read from a finished run's buffer; bytes held per event."""
    gc.collect()
    tracemalloc.start()
    async with hierplan.start("many leaves", **_options(leaves)) as handle:
        await handle.result()
    gc.collect()
    with_log = tracemalloc.get_traced_memory()[0]
    log = handle._log  # the buffer itself, for its size
    handle._log = []
    del log
    gc.collect()
    without_log = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    async with hierplan.start("many leaves", **_options(leaves)) as handle:
        await handle.result()
    count = handle.event_count
    rates = {}
    for label, as_json in (("plain", False), ("json", True)):
        t0 = time.perf_counter()
        n = 0
        async for event in handle.events():
            if as_json:
                event.model_dump_json()
            n += 1
        rates[label] = n / (time.perf_counter() - t0)
    _, _, lag = await _watched(leaves, False)
    return {
        "events": count,
        "read_per_s": rates["plain"],
        "read_json_per_s": rates["json"],
        "bytes_per_event": (with_log - without_log) / count,
        "live_lag_events": lag,
    }


async def _interleaved(
    leaves: int, repeat: int, runs: dict[str, Callable[[int], Awaitable[float]]]
) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in runs}
    for fn in runs.values():  # warm up
        await fn(leaves)
    # What is alive now (modules, schemas, the warm-up's leftovers) is left out of later
    # collections: otherwise whether one full collection of the whole interpreter (about 45 ms
    # here) happens to fall inside a 0.1 s run decides the ratio, more than the consumer does.
    gc.collect()
    gc.freeze()
    try:
        for _ in range(repeat):
            for name, fn in runs.items():
                gc.collect()
                times[name].append(await fn(leaves))
    finally:
        gc.unfreeze()
    return {name: statistics.median(ts) for name, ts in times.items()}


async def main(leaves: int, repeat: int) -> dict[str, Any]:
    """Every figure, as a dict."""
    medians = await _interleaved(
        leaves, repeat, {"bare": bare, "consumer": consumed, "consumer_json": consumed_json}
    )
    rates = await read_rate(leaves)
    return {
        "leaves": leaves,
        "repeat": repeat,
        "median_s": medians,
        "overhead_consumer": medians["consumer"] / medians["bare"],
        "overhead_consumer_json": medians["consumer_json"] / medians["bare"],
        **rates,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--leaves", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    figures = anyio.run(main, args.leaves, args.repeat)
    m = figures["median_s"]
    print(f"run of {figures['leaves']} leaves, {figures['events']} events, median of {args.repeat}")
    print(f"  no listener            {m['bare']:.3f} s")
    print(
        f"  handle + consumer      {m['consumer']:.3f} s  ratio {figures['overhead_consumer']:.3f}"
    )
    print(
        f"  handle + JSON consumer {m['consumer_json']:.3f} s  "
        f"ratio {figures['overhead_consumer_json']:.3f}"
    )
    print(f"read rate: {figures['read_per_s']:,.0f} events/s plain")
    print(f"           {figures['read_json_per_s']:,.0f} events/s as JSON")
    print(f"live lag at the end of the run: {figures['live_lag_events']} events")
    print(f"buffer memory: {figures['bytes_per_event']:,.0f} bytes per event")
    print(json.dumps(figures))
