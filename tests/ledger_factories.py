"""The ledger implementations the contract and property tests run against.

A ledger shared between processes (on Redis, say) joins every ledger test by adding its factory
here.
"""

from __future__ import annotations

from collections.abc import Callable

from hierplan.budgets.budget import Ledger, LocalLedger

LEDGERS: dict[str, Callable[[], Ledger]] = {"local": LocalLedger}
