"""Batch runs: many goals under one global budget, journaled and resumable, on this machine
(anyio) or on Celery workers with Redis. See :func:`run_batch` and ``hierplan batch``."""

from __future__ import annotations

from hierplan.batch.budget import BatchBudget, GoalLedger
from hierplan.batch.core import BatchConfig, run_batch
from hierplan.batch.goals import BatchGoal, GoalLine, load_goals, parse_goals
from hierplan.batch.runner import RunOptions

__all__ = [
    "BatchBudget",
    "BatchConfig",
    "BatchGoal",
    "GoalLedger",
    "GoalLine",
    "RunOptions",
    "load_goals",
    "parse_goals",
    "run_batch",
]
