"""Provider adapters: overhead per call, and runs under injected faults.

Two measurements, both against the local wire server of the tests (no real provider):

1. **Overhead per call.** The wire server runs in its own process. For each provider and each
   kind of call (an executor turn with tools and a tool round in the history; a planning call
   with the plan schema), the same request is sent alternately through the adapter
   (``model.request``) and as a bare SDK call with the wire parameters built once beforehand
   (OpenAI: ``chat.completions.create``; Anthropic: ``messages.create(stream=True)`` read to the
   end). The ratio of median times is the adapter's overhead against a bare SDK call in the same
   run. The adapter's own work (building parameters and reading the reply, no I/O) is also timed
   alone.
2. **Faults.** Whole data-migration runs on each provider with 30% of requests faulted (429,
   500, 503/529, slow past the timeout, malformed JSON, missing usage, cut-off body; seeded),
   against clean runs: completion rate, attempts, and extra cost, both as recorded (what the
   provider reported, and a reply without usage at its worst case: the record never counts a
   call as free) and at the worst case a budget must assume (a reply without usage,
   and an attempt that timed out, broke off or came back unreadable, charged as its estimated
   input plus ``max_tokens``; 429 and 5xx answers are not billed).

Run: ``.venv/bin/python benchmarks/providers.py`` (``--calls``, ``--runs``, ``--rate``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anthropic
import anyio
import openai

import hierplan

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from hierplan.agents.planner import PLAN_SCHEMA  # noqa: E402
from hierplan.agents.prompts import (  # noqa: E402
    PlanPrompt,
    StepPrompt,
    render_plan_prompt,
    render_step_prompt,
)
from hierplan.errors import ModelError  # noqa: E402
from hierplan.models.anthropic import _Reply  # noqa: E402
from hierplan.models.base import (  # noqa: E402
    Message,
    Model,
    ModelRequest,
    ModelResponse,
    OutputSchema,
    ToolCall,
    ToolSpec,
)
from hierplan.models.tokens import estimate_request_tokens  # noqa: E402
from hierplan.pricing import PriceTable  # noqa: E402
from hierplan.runner.models import resolve_model  # noqa: E402
from hierplan.scenarios import get_scenario  # noqa: E402

MODELS = {"openai": "openai:gpt-5-mini", "anthropic": "anthropic:claude-haiku-4-5"}
KEY = "test-key"
TABLE = {"type": "object", "properties": {"table": {"type": "string"}}, "required": ["table"]}
TOOLS = tuple(
    ToolSpec(name, f"{name.replace('_', ' ')} for one table", TABLE)
    for name in ("read_schema", "create_table", "copy_rows", "create_indexes", "verify_table")
)
PLAN = {
    "goal": "Copy the rows of tables orders, order_items, payments, shipments, reviews",
    "steps": [
        {
            "id": f"copy_{t}",
            "title": f"Copy {t}",
            "instruction": f"Copy the rows of table {t} into the target database",
            "tool": "copy_rows",
            "args": {"table": t},
            "depends_on": [] if t == "orders" else ["copy_orders"],
        }
        for t in ("orders", "order_items", "payments", "shipments", "reviews")
    ],
    "rationale": "Parents before children; the children of orders copy in parallel.",
}


def requests() -> dict[str, ModelRequest]:
    """The two kinds of call measured: an executor turn and a planning call."""
    first = ToolCall("call_1", "copy_rows", {"table": "orders"})
    turn = (
        *render_step_prompt(
            StepPrompt("Copy the rows of tables orders, payments", "Migrate the shop database")
        ),
        Message("assistant", "", (first,)),
        Message("tool", '{"table": "orders", "rows": 40000}', tool_call_id="call_1"),
    )
    plan_prompt = PlanPrompt(goal=str(PLAN["goal"]), depth=2, max_depth=3, max_steps=50)
    return {
        "executor turn": ModelRequest(turn, tools=TOOLS, max_tokens=1024),
        "planning call": ModelRequest(
            render_plan_prompt(plan_prompt, TOOLS),
            output_schema=OutputSchema("plan", PLAN_SCHEMA),
            max_tokens=4096,
            phase="planning",
        ),
    }


def serve() -> None:
    """The wire server process: answers turns with two tool calls and plans with ``PLAN``."""
    from wire import RepeatBackend, Reply, WireCall, WireServer

    def answer(call: WireCall) -> Reply:
        if call.schema_name == "plan":
            return Reply(output=PLAN, input_tokens=1500, output_tokens=400)
        prefix = "toolu_" if call.provider == "anthropic" else "call_"
        calls = [(f"{prefix}{i}", "copy_rows", {"table": t}) for i, t in enumerate(("p", "q"))]
        return Reply(tool_calls=calls, input_tokens=700, output_tokens=40)

    server = WireServer(RepeatBackend(answer)).start()
    print(server.url, flush=True)
    sys.stdin.read()  # serve until the parent closes our stdin
    server.stop()


@dataclass
class Timings:
    """Wall-clock and client CPU seconds of each call, per arm."""

    wall: dict[str, list[float]] = field(default_factory=lambda: {"bare": [], "adapter": []})
    cpu: dict[str, list[float]] = field(default_factory=lambda: {"bare": [], "adapter": []})


async def timed(call: Callable[[], Awaitable[Any]]) -> tuple[float, float]:
    """Wall-clock seconds, and CPU seconds this process spent (the server has its own)."""
    wall, cpu = time.perf_counter(), time.process_time()
    await call()
    return time.perf_counter() - wall, time.process_time() - cpu


def bare_call(provider: str, client: Any, params: dict[str, Any]) -> Callable[[], Awaitable[Any]]:
    """The same call without the adapter: the wire parameters are built beforehand."""
    if provider == "openai":

        async def openai_call() -> Any:
            completion = await client.chat.completions.create(**params)
            return completion.choices[0].message

        return openai_call

    async def anthropic_call() -> Any:
        stream = await client.messages.create(**params)
        async with stream:
            async for _ in stream:
                pass

    return anthropic_call


async def overhead(url: str, calls: int) -> list[dict[str, Any]]:
    rows = []
    for provider in ("openai", "anthropic"):
        base = url + "/v1" if provider == "openai" else url
        model = resolve_model(MODELS[provider], api_key=KEY, base_url=base, timeout_s=30)
        client: Any
        if provider == "openai":
            client = openai.AsyncOpenAI(api_key=KEY, base_url=base, max_retries=0, timeout=30)
        else:
            client = anthropic.AsyncAnthropic(api_key=KEY, base_url=base, max_retries=0, timeout=30)
        for kind, request in requests().items():
            params = model.build_params(request)  # type: ignore[attr-defined]
            bare = bare_call(provider, client, params)

            async def through_adapter(
                request: ModelRequest = request, model: Model = model
            ) -> ModelResponse:
                return await model.request(request)

            times = Timings()
            arms = {"bare": bare, "adapter": through_adapter}
            for i in range(calls + 30):
                order = ("bare", "adapter") if i % 2 else ("adapter", "bare")
                for arm in order:  # alternate, so drift in the machine's load hits both
                    wall, cpu = await timed(arms[arm])
                    if i >= 30:  # after warm-up
                        times.wall[arm].append(wall)
                        times.cpu[arm].append(cpu)
            own = await own_work(provider, model, client, params, request)
            mid = {arm: statistics.median(v) for arm, v in times.wall.items()}
            mean_cpu = {arm: statistics.mean(v) for arm, v in times.cpu.items()}
            rows.append(
                {
                    "provider": provider,
                    "call": kind,
                    "bare SDK ms (median)": round(mid["bare"] * 1000, 3),
                    "adapter ms (median)": round(mid["adapter"] * 1000, 3),
                    "wall ratio": round(mid["adapter"] / mid["bare"], 3),
                    "client CPU ratio": round(mean_cpu["adapter"] / mean_cpu["bare"], 3),
                    "client CPU us bare/adapter": (
                        f"{mean_cpu['bare'] * 1e6:.0f}/{mean_cpu['adapter'] * 1e6:.0f}"
                    ),
                    "adapter own work us": round(own * 1e6, 1),
                }
            )
        await model.aclose()  # type: ignore[attr-defined]
        await client.close()
    return rows


async def own_work(
    provider: str, model: Any, client: Any, params: dict[str, Any], request: ModelRequest
) -> float:
    """Median time of the adapter's work without I/O: build the parameters, read the reply."""
    if provider == "openai":
        completion = await client.chat.completions.create(**params)

        def work() -> None:
            model.build_params(request)
            model.parse_completion(completion, request)

    else:
        stream = await client.messages.create(**params)
        events = [event async for event in stream]

        def work() -> None:
            model.build_params(request)
            reply = _Reply()
            for event in events:
                reply.add(event)
            model.to_response(reply, request)

    samples = []
    for _ in range(7):
        started = time.perf_counter()
        for _ in range(200):
            work()
        samples.append((time.perf_counter() - started) / 200)
    return statistics.median(samples)


class AttemptLedger(hierplan.Instrument):
    """Sees every attempt, as a budget ledger does, and sorts it by what it may have cost.

    ``reported``: the provider reported usage (priced as reported). ``unreported``: a reply
    without usage, or an attempt that timed out, broke off or came back unreadable: the provider
    did the work and may bill it, but said nothing. ``refused``: an HTTP error (429, 5xx), not
    billed.
    """

    def __init__(self, pricing: PriceTable) -> None:
        self.pricing = pricing
        self.reported_usd = 0.0
        self.reported = 0
        self.unreported = 0
        self.reserved_usd = 0.0  # the worst case of the unreported attempts
        self.attempts = 0

    def _worst(self, model: Model, request: ModelRequest) -> float:
        usage = hierplan.Usage(estimate_request_tokens(request), request.max_tokens)
        return self.pricing.cost(model.priced_as, usage) or 0.0

    def settle(self, model: Model, request: ModelRequest, usage: hierplan.Usage | None) -> None:
        if usage is None:
            self.unreported += 1
            self.reserved_usd += self._worst(model, request)
        else:
            self.reported += 1
            self.reported_usd += self.pricing.cost(model.priced_as, usage) or 0.0

    def wrap_model(self, model: Model, node: hierplan.NodeView) -> Model:
        ledger = self

        class Ledgered:
            name, provider = model.name, model.provider
            priced_as, simulated = model.priced_as, model.simulated

            async def request(self, request: ModelRequest) -> ModelResponse:
                ledger.attempts += 1
                try:
                    response = await model.request(request)
                except ModelError as exc:
                    if "HTTP " not in str(exc) or exc.usage is not None:
                        ledger.settle(model, request, exc.usage)
                    raise
                ledger.settle(model, request, response.usage)
                return response

        return Ledgered()


async def one_run(
    provider: str, workdir: Path, oracle: Any, rate: float, seed: int
) -> dict[str, Any]:
    from wire import OracleBackend, WireServer

    ledger = AttemptLedger(PriceTable())
    with WireServer(OracleBackend(oracle), slow_s=0.6) as server:
        server.faults.random(rate, seed=seed)
        result = await hierplan.run(
            scenario="data_migration",
            model=hierplan.ModelSpec(
                name=MODELS[provider],
                **{
                    "base_url": server.base_url(provider),
                    "api_key": KEY,
                    "timeout_s": 0.3,
                },
            ),
            workdir=workdir,
            settings=hierplan.RunSettings(retry_backoff_s=0.05),
            instruments=[ledger],
        )
        faults = server.failures()
    calls = [c for n in result.nodes() for c in n.calls]
    mean_reported = ledger.reported_usd / max(1, ledger.reported)
    return {
        "completed": result.status == "succeeded" and bool((result.verification or {}).get("ok")),
        "attempts": len(calls),
        "failed_attempts": sum(not c.ok for c in calls),
        "faults_injected": faults,
        "ledger_attempts": ledger.attempts,
        "recorded_usd": result.totals()["cost_usd"],
        # unreported attempts at the mean cost of a reported one: what the bill likely shows
        "estimated_usd": ledger.reported_usd + ledger.unreported * mean_reported,
        # unreported attempts at their reserved worst case: what a budget must hold back
        "worst_case_usd": ledger.reported_usd + ledger.reserved_usd,
    }


async def fault_runs(runs: int, rate: float) -> list[dict[str, Any]]:
    workdir = Path(tempfile.mkdtemp(prefix="hierplan-bench-"))
    oracle = get_scenario("data_migration").setup(workdir).oracle
    rows = []
    for provider in ("openai", "anthropic"):
        clean = [await one_run(provider, workdir, oracle, 0.0, seed) for seed in range(2)]
        faulted = [
            await one_run(provider, workdir, oracle, rate, 100 + seed) for seed in range(runs)
        ]
        assert all(r["ledger_attempts"] == r["attempts"] for r in clean + faulted)
        base = statistics.mean(r["recorded_usd"] for r in clean)
        done = [r for r in faulted if r["completed"]] or faulted

        def extra(key: str, rows: list[dict[str, Any]] = done, base: float = base) -> float:
            return round(100 * (float(statistics.mean(r[key] for r in rows)) / base - 1), 1)

        rows.append(
            {
                "provider": provider,
                "completed": f"{sum(r['completed'] for r in faulted)}/{runs}",
                "attempts clean/faulted": (
                    f"{statistics.mean(r['attempts'] for r in clean):.0f}/"
                    f"{statistics.mean(r['attempts'] for r in faulted):.1f}"
                ),
                "failed attempts per run": round(
                    statistics.mean(r["failed_attempts"] for r in faulted), 1
                ),
                "all failed attempts recorded": all(
                    r["failed_attempts"] == r["faults_injected"] for r in faulted
                ),
                "clean USD per run": round(base, 5),
                "extra cost recorded %": extra("recorded_usd"),
                "extra cost estimated %": extra("estimated_usd"),
                "extra cost worst case %": extra("worst_case_usd"),
            }
        )
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    keys = list(rows[0])
    lines = [" | ".join(keys), " | ".join("---" for _ in keys)]
    lines += [" | ".join(str(row[k]) for k in keys) for row in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--calls", type=int, default=300, help="timed calls per arm and case")
    parser.add_argument("--runs", type=int, default=10, help="faulted runs per provider")
    parser.add_argument("--rate", type=float, default=0.3, help="share of faulted requests")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--skip-runs", action="store_true", help="only measure overhead")
    args = parser.parse_args()
    if args.serve:
        serve()
        return
    process = subprocess.Popen(
        [sys.executable, __file__, "--serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stdin is not None
    url = process.stdout.readline().strip()
    try:
        rows = anyio.run(overhead, url, args.calls)
    finally:
        process.stdin.close()
        process.wait(timeout=10)
    print("Adapter overhead per call (wire server in its own process)\n")
    print(table(rows))
    results: dict[str, Any] = {"overhead": rows}
    if not args.skip_runs:
        runs = anyio.run(fault_runs, args.runs, args.rate)
        print(f"\nData-migration runs with {args.rate:.0%} of requests faulted\n")
        print(table(runs))
        results["faults"] = runs
    out = ROOT / "benchmarks" / "results" / "providers.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"\nwritten to {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
