"""The ledger implementations the contract and property tests run against.

A ledger shared between processes joins every ledger test by adding its factory here: the
Redis ledger runs against a server of the tests' own (see ``redis_support``).
"""

from __future__ import annotations

from collections.abc import Callable

from redis_support import redis_available, redis_ledger

from hierplan.budgets.budget import Ledger, LocalLedger

LEDGERS: dict[str, Callable[[], Ledger]] = {"local": LocalLedger}
if redis_available():
    LEDGERS["redis"] = redis_ledger
