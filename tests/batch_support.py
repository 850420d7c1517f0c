"""Helpers of the batch tests: goals files, and a stand-in model for free-text goals.

Free-text goals need a real model; the tests give them a strict function model instead
(priced as a real one), through the batch's ``run_fn`` seam. ``python batch_support.py OUT
GOALS BUDGET_USD CONCURRENCY [--resume]`` runs such a batch in a process of its own (for the
crash tests).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from functools import partial
from pathlib import Path
from typing import Any

import anyio

from hierplan.batch import BatchBudget, BatchConfig, RunOptions, run_batch
from hierplan.models.base import ModelRequest, ModelResponse
from hierplan.models.scripted import FunctionModel
from hierplan.models.tokens import estimate_request_tokens
from hierplan.records import RunResult
from hierplan.runner.run import run
from hierplan.units import Usage, usd_to_pico

PRICED_AS = "openai:gpt-5-mini"


def text_goals(path: Path, count: int) -> Path:
    """A goals file of ``count`` free-text goals for a real model (the stand-in answers them)."""
    lines = [
        json.dumps({"goal": f"Answer question {i}", "model": PRICED_AS, "strategy": "react"})
        for i in range(count)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def stand_in(
    delay_s: float = 0.0, output_tokens: int = 200, *, hold: str | None = None
) -> FunctionModel:
    """A model that answers every call with a final answer, after ``delay_s``.

    A call whose messages mention ``hold`` never returns: that goal stays running until the
    process is killed, so a crash test always finds a goal in flight.
    """

    async def respond(request: ModelRequest) -> ModelResponse:
        if hold is not None and any(hold in m.content for m in request.messages):
            await anyio.sleep_forever()
        if delay_s:
            await anyio.sleep(delay_s)
        usage = Usage(estimate_request_tokens(request), output_tokens)
        return ModelResponse(text="the answer is 42", usage=usage)

    model = FunctionModel(respond)
    model.priced_as = PRICED_AS
    return model


async def run_with_stand_in(stand: FunctionModel, goal: str | None, **kwargs: Any) -> RunResult:
    """:func:`hierplan.run` with the stand-in in place of the goal's model."""
    kwargs["model"] = stand
    return await run(goal, **kwargs)


def config(
    goals: Path,
    out: Path,
    budget_usd: float | None,
    concurrency: int,
    *,
    resume: bool = False,
    delay_s: float = 0.0,
    goal_budget_usd: float | None = None,
    hold: str | None = None,
) -> BatchConfig:
    """A local batch of stand-in goals."""
    return BatchConfig(
        goals,
        out,
        BatchBudget(
            None,
            None if budget_usd is None else usd_to_pico(budget_usd),
            concurrency,
            None,
            None if goal_budget_usd is None else usd_to_pico(goal_budget_usd),
        ),
        RunOptions(sim_latency_scale=0),
        resume=resume,
        run_fn=partial(run_with_stand_in, stand_in(delay_s, hold=hold)),
    )


def load_benchmark() -> Any:
    """``benchmarks/batch.py`` as a module (for its smoke tests)."""
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "batch.py"
    spec = importlib.util.spec_from_file_location("batch_benchmark", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str]) -> None:
    out, goals, budget, concurrency = Path(argv[0]), Path(argv[1]), float(argv[2]), int(argv[3])
    resume = "--resume" in argv
    # Before the crash the first goal holds its slot, so the kill always lands while a goal
    # runs: goals that all take the same time would otherwise finish in waves, with moments
    # when none is running. After the crash every goal answers.
    hold = None if resume else "Answer question 0"
    summary = anyio.run(
        run_batch,
        config(goals, out, budget, concurrency, resume=resume, delay_s=0.15, hold=hold),
    )
    print(json.dumps(summary))


if __name__ == "__main__":
    main(sys.argv[1:])
