"""A run's budget as it stands now, node by node: what :meth:`RunBudget.snapshot
<hierplan.budgets.instrument.RunBudget.snapshot>` (and ``RunHandle.budget_snapshot``) give.

An open node's figures come from its ledger account; a closed node's from its record's
``budget``, which its account wrote when it closed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hierplan.budgets.budget import Account, Balance, LedgerError
from hierplan.budgets.ledger import Ledger, LocalLedger
from hierplan.records import NodeRecord
from hierplan.units import PICO_PER_USD


@dataclass(slots=True, frozen=True)
class AccountSnapshot:
    """One node's account at the moment of a snapshot. Token figures are whole tokens, USD
    figures floats (``None`` when the run's USD spend is not tracked).

    ``grant``: how the account is funded (``root``, ``share``, ``draw`` for an on-demand node,
    ``fixed``). ``limit_*``: the node's allocation, what it may spend (an on-demand node's cap);
    ``None`` where unlimited. ``spent_*``: what it has spent (its own calls, its closed
    children's, and its on-demand children's as they go). ``held_*``: what it holds now for
    calls in flight. ``remaining_*``: what it could reserve now (``None`` where unlimited; 0
    once closed). ``closed``: whether the node has ended.
    """

    path: str
    grant: str
    limit_tokens: int | None
    limit_usd: float | None
    spent_tokens: int
    spent_usd: float | None
    held_tokens: int
    held_usd: float | None
    remaining_tokens: int | None
    remaining_usd: float | None
    closed: bool


def open_account(
    path: str,
    balance: Balance,
    available: tuple[int | None, int | None],
    usd_tracked: bool,
) -> AccountSnapshot:
    """The snapshot of an open account from its ledger figures."""
    avail_t, avail_p = available
    if balance.closed:  # closed since it was looked up: it can reserve nothing more
        avail_t = None if balance.limit_tokens is None else 0
        avail_p = None if balance.limit_pico is None else 0
    return AccountSnapshot(
        path=path,
        grant=balance.grant,
        limit_tokens=balance.limit_tokens,
        limit_usd=_usd(balance.limit_pico, usd_tracked),
        spent_tokens=balance.spent_tokens,
        spent_usd=_usd(balance.spent_pico, usd_tracked),
        held_tokens=balance.reserved_tokens,
        held_usd=_usd(balance.reserved_pico, usd_tracked),
        remaining_tokens=avail_t,
        remaining_usd=_usd(avail_p, usd_tracked),
        closed=balance.closed,
    )


def closed_account(path: str, budget: dict[str, Any]) -> AccountSnapshot:
    """The snapshot of a closed account from the ``budget`` its node's record holds."""
    limit_t, limit_usd = budget.get("limit_tokens"), budget.get("limit_usd")
    spent_usd = budget.get("spent_usd")
    usd = 0.0 if spent_usd is not None else None
    return AccountSnapshot(
        path=path,
        grant=str(budget.get("grant", "")),
        limit_tokens=limit_t,
        limit_usd=limit_usd,
        spent_tokens=int(budget.get("spent_tokens") or 0),
        spent_usd=spent_usd,
        held_tokens=0,
        held_usd=usd,
        remaining_tokens=None if limit_t is None else 0,
        remaining_usd=None if limit_usd is None else 0.0,
        closed=True,
    )


async def snapshot_of(
    ledger: Ledger,
    open_accounts: Mapping[str, Account],
    tree: NodeRecord | None,
    usd_tracked: bool,
) -> dict[str, AccountSnapshot]:
    """Every node's account now, as :meth:`RunBudget.snapshot
    <hierplan.budgets.instrument.RunBudget.snapshot>` gives them: the open ones
    (``open_accounts``, by node path) from ``ledger``, the closed ones from their records in
    ``tree``, in the order of the tree."""
    live: dict[str, AccountSnapshot] = {}
    for path, account in list(open_accounts.items()):
        if isinstance(ledger, LocalLedger):
            balance, available = ledger.balance_now(account), ledger.available_now(account)
        else:
            try:
                balance = await ledger.balance(account)
                available = await ledger.available(account)
            except LedgerError:
                continue  # closed and gone meanwhile: its record has its figures
        live[path] = open_account(path, balance, available, usd_tracked)
    if tree is None:
        return live
    found: dict[str, AccountSnapshot] = {}
    for record in tree.walk():
        path = record.path
        figures = live.get(path)
        if figures is None and record.budget is not None and path not in open_accounts:
            figures = closed_account(path, record.budget)
        if figures is not None:
            found[path] = figures
    return found


def _usd(pico: int | None, tracked: bool) -> float | None:
    return None if pico is None or not tracked else pico / PICO_PER_USD
