"""A node's budget record over the parts of a run that paused and was resumed: what it was
first given, and what every part spent and released, added up exactly."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from hierplan.units import PICO_PER_USD

# Figures of a node's budget record that add up over the parts of a paused run, and those
# that stay as the node was first given them. ``released`` is neither: see ``_released``.
_ADDED = (
    "spent_tokens",
    "overrun_tokens",
    "spent_usd",
    "overrun_usd",
    "planning_tokens",
    "planning_usd",
    "execution_tokens",
    "execution_usd",
    "lowered",
    "refused",
)

_FIRST = ("policy", "grant", "limit_tokens", "allocated_tokens", "limit_usd", "allocated_usd")

_MOST = ("peak_reserved_tokens", "peak_reserved_usd")

# Per dimension: the allocation, the release, and whether the figures are USD.
_RELEASES = (
    ("allocated_tokens", "released_tokens", False),
    ("allocated_usd", "released_usd", True),
)


def _continued(prior: dict[str, Any] | None, now: dict[str, Any]) -> dict[str, Any]:
    """A node's budget record over the parts of a paused run: ``prior`` from before the pause
    (``None`` for a node that starts in this part), ``now`` from this part. The limit and
    allocation are those it was first given (this part's account gets what was left), but for
    an on-demand node, whose allocation is what it drew."""
    if not prior:
        return now
    merged = dict(now)
    for key in _FIRST:
        if key in prior:
            merged[key] = prior[key]
    for key in _ADDED:
        before, after = prior.get(key), now.get(key)
        merged[key] = None if before is None and after is None else (before or 0) + (after or 0)
    for key in _MOST:
        values = [v for v in (prior.get(key), now.get(key)) if v is not None]
        merged[key] = max(values) if values else None
    draws = now.get("grant") == "draw"
    for allocated, released, usd in _RELEASES:
        if draws:
            # An on-demand node's allocation is what it drew, and its release what it gave
            # back of that, call by call: both add up over the parts, as its spend does.
            merged[allocated] = _summed(prior.get(allocated), now.get(allocated), usd)
            merged[released] = _summed(prior.get(released), now.get(released), usd)
        else:
            merged[released] = _released(prior, now, allocated, released, usd)
    return merged


def _released(
    prior: dict[str, Any], now: dict[str, Any], allocated: str, released: str, usd: bool
) -> int | float | None:
    """What a node gave back over the parts of a paused run, so that its first allocation is
    what it spent plus this. At the pause its account gave back what it had not spent, and this
    part's account took its allocation back out of that pool: adding both releases would count
    the unspent part once per pause. Never below 0, as a ledger's release (a node that spent
    more than it was first given released nothing)."""
    before, after, taken = prior.get(released), now.get(released), now.get(allocated)
    if before is None and after is None:
        return None  # an unlimited dimension
    net = _exact(before, usd) + _exact(after, usd) - _exact(taken, usd)
    return max(0, net) / PICO_PER_USD if usd else max(0, net)


def _summed(before: int | float | None, after: int | float | None, usd: bool) -> int | float | None:
    """Two parts' figures added (``None``: an unlimited dimension)."""
    if before is None and after is None:
        return None
    total = _exact(before, usd) + _exact(after, usd)
    return total / PICO_PER_USD if usd else total


def _exact(figure: int | float | None, usd: bool) -> int:
    """A record's figure as an integer (USD as pico-dollars), to add and subtract exactly."""
    if figure is None:
        return 0
    return round(Decimal(repr(float(figure))) * PICO_PER_USD) if usd else int(figure)
