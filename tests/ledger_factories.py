"""The ledger implementations the contract and property tests run against.

A ledger shared between processes joins every ledger test by adding its factory here: the
Redis ledger runs against a server of the tests' own (see ``redis_support``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from redis_support import redis_available, redis_ledger

from hierplan.budgets.instrument import BudgetInstrument, RunBudget
from hierplan.budgets.ledger import Ledger, LocalLedger
from hierplan.core.views import RunView

LEDGERS: dict[str, Callable[[], Ledger]] = {"local": LocalLedger}
if redis_available():
    LEDGERS["redis"] = redis_ledger


class RecordingBudget(BudgetInstrument):
    """A budget instrument that keeps the :class:`RunBudget` of every run it served, in the
    order they started, so that a test can read a run's root balance after the run."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.runs: list[RunBudget] = []

    def for_run(self, run: RunView) -> RunBudget:
        """The run's budget, as the instrument makes it; kept the first time."""
        new = self not in run.state
        budget = super().for_run(run)
        if new:
            self.runs.append(budget)
        return budget
