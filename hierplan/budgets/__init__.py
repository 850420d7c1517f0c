"""Budgets: token and USD limits per node of the run tree, exact under concurrency.

:mod:`hierplan.budgets.budget` holds :class:`Budget` and the :class:`Ledger` contract (with
:class:`LocalLedger`); :mod:`hierplan.budgets.instrument` plugs them into a run (and
:mod:`hierplan.budgets.snapshot` says where each node's account stands while it goes);
:mod:`hierplan.pricing` holds the price table.
"""

from __future__ import annotations

from hierplan.budgets.budget import (
    ALLOCATIONS,
    Account,
    Balance,
    Budget,
    Draw,
    Fixed,
    LedgerError,
    Reservation,
    Share,
)
from hierplan.budgets.ledger import Ledger, LocalLedger, Outstanding
from hierplan.budgets.snapshot import AccountSnapshot
from hierplan.pricing import Price, PriceTable
from hierplan.units import PICO_PER_USD, pico_to_usd, usd_to_pico

__all__ = [
    "ALLOCATIONS",
    "PICO_PER_USD",
    "Account",
    "AccountSnapshot",
    "Balance",
    "Budget",
    "Draw",
    "Fixed",
    "Ledger",
    "LedgerError",
    "LocalLedger",
    "Outstanding",
    "Price",
    "PriceTable",
    "Reservation",
    "Share",
    "pico_to_usd",
    "usd_to_pico",
]
