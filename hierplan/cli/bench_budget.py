"""``hierplan bench --budget-usd``: one budget for the whole benchmark, on the global ledger
``hierplan batch`` uses.

Each run is one goal of a batch: before it starts, :func:`hierplan.batch.budget.grant_goal`
grants it an account under the benchmark's root account (its cap an equal part of the budget
per concurrent run, as for a batch's goals without caps of their own), it waits while other
runs hold what it needs, and it is not started when what is left is below the least one
planning call needs; its model calls reserve and settle through a
:class:`~hierplan.batch.budget.GoalLedger`, and what it did not spend returns when it ends. A
run that could not start is recorded as ``not_started_budget``: in no figure, and run again by
``--resume``, where the runs already recorded count against the budget.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import anyio

from hierplan.batch.budget import BatchBudget, GoalLedger, goal_minimum, grant_goal
from hierplan.batch.goals import BatchGoal, GoalLine
from hierplan.batch.runner import inner_budget
from hierplan.bench.harness import Admission, BenchRun
from hierplan.budgets.budget import Fixed
from hierplan.budgets.instrument import BudgetInstrument
from hierplan.budgets.ledger import LocalLedger
from hierplan.core.settings import RunSettings
from hierplan.pricing import PriceTable
from hierplan.units import PICO_PER_USD, usd_to_pico

BUDGET_OPTIONS = "--budget-usd (the whole benchmark's budget, shared by its concurrent runs)"


class BenchBudget:
    """The benchmark's budget: a :class:`~hierplan.bench.harness.RunGate` on batch's ledger.

    ``spent_usd`` is what the runs already recorded spent (a resumed benchmark's).
    """

    def __init__(
        self,
        usd: float,
        *,
        concurrency: int,
        model: str,
        pricing: PriceTable,
        spent_usd: float = 0.0,
    ) -> None:
        self.budget = BatchBudget(tokens=None, pico=usd_to_pico(usd), concurrency=concurrency)
        self.model = model
        self.pricing = pricing
        self.ledger = LocalLedger()
        left = max(0, usd_to_pico(usd) - usd_to_pico(spent_usd))
        self.root = self.ledger.open_now("bench", None, Fixed(None, left))
        self._ended = anyio.Event()

    def admit(
        self, spec: BenchRun, settings: RunSettings, goal: str
    ) -> AbstractAsyncContextManager[Admission]:
        """Grant ``spec`` its part of the budget (waiting while other runs hold it), or refuse
        it a start; its account is closed when it ends."""
        return self._admit(spec, settings, goal)

    @asynccontextmanager
    async def _admit(
        self, spec: BenchRun, settings: RunSettings, goal: str
    ) -> AsyncIterator[Admission]:
        cap = self.budget.default_cap()
        # The run as a goal of a batch, for the least its first planning call needs.
        as_goal = BatchGoal(spec.run_id, 0, GoalLine(goal=goal))
        minimum = goal_minimum(as_goal, self.model, self.pricing, settings)
        while True:
            decision, account, grant = await grant_goal(
                self.ledger, self.root, spec.run_id, cap, minimum
            )
            if decision != "wait":
                break
            await self._ended.wait()
        if decision == "skip" or account is None:
            left = (await self.ledger.available(self.root))[1] or 0
            yield Admission(
                refused=f"not started: the benchmark's budget has ${left / PICO_PER_USD:.6f} "
                f"left, below the ${minimum[1] / PICO_PER_USD:.6f} its first planning call needs"
            )
            return
        instrument = BudgetInstrument(
            inner_budget(grant, cap),
            ledger=GoalLedger(self.ledger, account),
            budget_options=BUDGET_OPTIONS,
        )
        try:
            yield Admission(instruments=(instrument,))
        finally:
            await self.ledger.close(account)
            # Wake the runs waiting for a grant: what this one did not spend is free again.
            self._ended.set()
            self._ended = anyio.Event()

    def spent_usd(self) -> float:
        """What the runs of this invocation spent."""
        balance = self.ledger.balance_now(self.root)
        return balance.spent_pico / PICO_PER_USD
