"""The ledger contract: every ledger implementation must pass these tests.

They are parametrised over the ledger factories of ``ledger_factories.LEDGERS``.
"""

from __future__ import annotations

import pytest
from ledger_factories import LEDGERS

from hierplan.budgets.budget import Budget, Draw, Fixed, LedgerError, Share, step_weights
from hierplan.budgets.ledger import Ledger
from hierplan.core.views import StepWork
from hierplan.errors import BudgetExceeded, UserInputError
from hierplan.hierarchy.context import step_work
from hierplan.plans.plan import Plan, Step
from hierplan.units import pico_to_usd, rate_to_pico, usd_to_pico


@pytest.fixture(params=sorted(LEDGERS))
def ledger(request: pytest.FixtureRequest) -> Ledger:
    return LEDGERS[request.param]()


pytestmark = pytest.mark.anyio


async def test_reserve_within_the_limit_and_refuse_beyond(ledger: Ledger) -> None:
    root = await ledger.open("1", None, Fixed(100, None))
    first = await ledger.reserve(root, 60, 0, "execution")
    assert first is not None
    assert await ledger.reserve(root, 41, 0, "execution") is None
    second = await ledger.reserve(root, 40, 0, "execution")
    assert second is not None
    assert await ledger.available(root) == (0, None)
    await ledger.settle(first, 10, 0)
    assert await ledger.available(root) == (50, None)
    await ledger.release(second)
    assert await ledger.available(root) == (90, None)
    balance = await ledger.close(root)
    assert (balance.allocated_tokens, balance.spent_tokens, balance.released_tokens) == (
        100,
        10,
        90,
    )
    assert balance.peak_reserved_tokens == 100
    assert balance.denied == 1
    assert balance.balanced


async def test_usd_and_tokens_are_both_enforced(ledger: Ledger) -> None:
    root = await ledger.open("1", None, Fixed(1_000, usd_to_pico(0.01)))
    assert await ledger.reserve(root, 10, usd_to_pico(0.02), "planning") is None
    assert await ledger.reserve(root, 2_000, 1, "planning") is None
    held = await ledger.reserve(root, 500, usd_to_pico(0.006), "planning")
    assert held is not None
    assert await ledger.available(root) == (500, usd_to_pico(0.004))
    await ledger.settle(held, 400, usd_to_pico(0.005))
    balance = await ledger.close(root)
    assert balance.spent_pico == usd_to_pico(0.005)
    assert balance.released_pico == usd_to_pico(0.005)
    assert balance.own["planning"] == (400, usd_to_pico(0.005))
    assert balance.own["execution"] == (0, 0)
    assert balance.balanced


async def test_an_unlimited_dimension_is_counted_but_never_refused(ledger: Ledger) -> None:
    root = await ledger.open("1", None, Fixed(None, usd_to_pico(1)))
    held = await ledger.reserve(root, 10**9, 5, "execution")
    assert held is not None
    await ledger.settle(held, 10**8, 5)
    balance = await ledger.close(root)
    assert balance.limit_tokens is None and balance.allocated_tokens is None
    assert balance.spent_tokens == 10**8
    assert balance.balanced


async def test_share_carves_from_what_the_parent_has_left(ledger: Ledger) -> None:
    root = await ledger.open("1", None, Fixed(1_000, None))
    held = await ledger.reserve(root, 200, 0, "planning")
    assert held is not None
    child = await ledger.open("1.1", root, Share(0.5, 0.5))
    assert (await ledger.balance(child)).limit_tokens == 400
    assert await ledger.available(root) == (400, None)
    sibling = await ledger.open("1.2", root, Share(1.0, 1.0))
    assert (await ledger.balance(sibling)).limit_tokens == 400
    assert await ledger.available(root) == (0, None)
    call = await ledger.reserve(child, 400, 0, "execution")
    assert call is not None
    assert await ledger.reserve(child, 1, 0, "execution") is None
    await ledger.settle(call, 150, 0)
    closed = await ledger.close(child)
    assert (closed.allocated_tokens, closed.spent_tokens, closed.released_tokens) == (400, 150, 250)
    assert await ledger.available(root) == (250, None)
    await ledger.close(sibling)
    await ledger.settle(held, 200, 0)
    balance = await ledger.close(root)
    assert balance.spent_tokens == 350  # the subtree: its own 200 and the child's 150
    assert balance.own["planning"] == (200, 0)
    assert balance.balanced
    out = await ledger.outstanding()
    assert (out.reservations, out.tokens, out.pico, out.accounts) == (0, 0, 0, 0)


async def test_a_top_up_moves_what_the_parent_has_free_and_comes_back_on_close(
    ledger: Ledger,
) -> None:
    root = await ledger.open("1", None, Fixed(1_000, usd_to_pico(1.0)))
    child = await ledger.open("1.1", root, Share(0.25, 0.25))
    sibling = await ledger.open("1.2", root, Share(0.5, 0.5))
    assert await ledger.available(child) == (250, usd_to_pico(0.25))
    assert await ledger.top_up(child, 300, usd_to_pico(0.3))
    assert await ledger.available(child) == (550, usd_to_pico(0.55))
    assert await ledger.available(root) == (75, usd_to_pico(0.075))
    # more than the parent has free: nothing moves
    assert not await ledger.top_up(child, 76, 0)
    assert await ledger.available(child) == (550, usd_to_pico(0.55))
    held = await ledger.reserve(child, 500, usd_to_pico(0.5), "execution")
    assert held is not None
    await ledger.settle(held, 100, usd_to_pico(0.1))
    closed = await ledger.close(child)
    assert (closed.limit_tokens, closed.allocated_tokens, closed.released_tokens) == (550, 550, 450)
    assert closed.balanced
    assert await ledger.available(root) == (525, usd_to_pico(0.525))
    # a root, a closed account and an account that draws take no top-up
    drawing = await ledger.open("1.3", root, Draw(0.5))
    assert not await ledger.top_up(root, 1, 0)
    assert not await ledger.top_up(child, 1, 0)
    assert not await ledger.top_up(drawing, 1, 0)
    with pytest.raises(LedgerError, match="cannot be negative"):
        await ledger.top_up(sibling, -1, 0)
    for account in (drawing, sibling):
        await ledger.close(account)
    assert (await ledger.close(root)).balanced


async def test_a_top_up_moves_only_limited_dimensions(ledger: Ledger) -> None:
    root = await ledger.open("1", None, Fixed(None, usd_to_pico(1.0)))
    child = await ledger.open("1.1", root, Share(0.5, 0.5))
    assert await ledger.top_up(child, 10**9, usd_to_pico(0.25))
    assert await ledger.available(child) == (None, usd_to_pico(0.75))
    await ledger.close(child)
    assert await ledger.available(root) == (None, usd_to_pico(1.0))


async def test_draw_takes_from_the_parent_per_call_and_is_capped(ledger: Ledger) -> None:
    root = await ledger.open("1", None, Fixed(1_000, None))
    a = await ledger.open("1.1", root, Draw(0.6))
    b = await ledger.open("1.2", root, Draw(0.6))
    assert (await ledger.balance(a)).limit_tokens == 600
    assert await ledger.available(root) == (1_000, None)  # nothing is taken up front
    first = await ledger.reserve(a, 600, 0, "execution")
    assert first is not None
    assert await ledger.reserve(a, 1, 0, "execution") is None  # a's cap
    assert await ledger.available(b) == (400, None)  # the pool, not b's cap
    assert await ledger.reserve(b, 401, 0, "execution") is None
    second = await ledger.reserve(b, 400, 0, "execution")
    assert second is not None
    assert (await ledger.balance(root)).reserved_tokens == 1_000
    await ledger.settle(first, 100, 0)
    await ledger.settle(second, 400, 0)
    assert await ledger.available(a) == (500, None)
    for account in (a, b):
        balance = await ledger.close(account)
        assert balance.balanced
        assert balance.spent_tokens <= (balance.limit_tokens or 0)
    balance_a = await ledger.balance(a)
    assert (balance_a.allocated_tokens, balance_a.spent_tokens, balance_a.released_tokens) == (
        600,
        100,
        500,
    )
    root_balance = await ledger.close(root)
    assert root_balance.spent_tokens == 500
    assert root_balance.balanced


async def test_shares_under_draws_and_draws_under_shares(ledger: Ledger) -> None:
    root = await ledger.open("1", None, Fixed(1_000, usd_to_pico(1)))
    drawn = await ledger.open("1.1", root, Draw(0.5))
    carved = await ledger.open("1.1.1", drawn, Share(0.5, 0.5))
    assert (await ledger.balance(carved)).limit_tokens == 250
    assert await ledger.available(root) == (750, usd_to_pico(0.75))
    leaf = await ledger.open("1.1.1.1", carved, Draw(1.0))
    held = await ledger.reserve(leaf, 250, usd_to_pico(0.25), "execution")
    assert held is not None
    assert await ledger.reserve(leaf, 1, 0, "execution") is None
    await ledger.settle(held, 50, usd_to_pico(0.05))
    for account in (leaf, carved, drawn):
        assert (await ledger.close(account)).balanced
    assert await ledger.available(root) == (950, usd_to_pico(0.95))
    final = await ledger.close(root)
    assert final.spent_tokens == 50 and final.spent_pico == usd_to_pico(0.05)
    assert final.balanced


async def test_overrun_is_charged_and_counted(ledger: Ledger) -> None:
    root = await ledger.open("1", None, Fixed(1_000, None))
    child = await ledger.open("1.1", root, Share(0.1, 0.1))
    held = await ledger.reserve(child, 100, 0, "execution")
    assert held is not None
    await ledger.settle(held, 130, 0)
    balance = await ledger.close(child)
    assert balance.overrun_tokens == 30
    assert balance.spent_tokens == 130 and balance.released_tokens == 0
    assert balance.balanced  # allocated + overspent == spent + released
    root_balance = await ledger.close(root)
    assert root_balance.spent_tokens == 130  # never hidden from the parent


async def test_fixed_grant_must_fit(ledger: Ledger) -> None:
    batch = await ledger.open("batch", None, Fixed(100, None))
    goal = await ledger.open("goal-1", batch, Fixed(80, None))
    with pytest.raises(BudgetExceeded, match="goal-2"):
        await ledger.open("goal-2", batch, Fixed(30, None))
    with pytest.raises(LedgerError, match="unlimited"):
        await ledger.open("goal-3", batch, Fixed(None, None))
    await ledger.close(goal)
    assert (await ledger.close(batch)).released_tokens == 100


async def test_a_grant_that_does_not_fit_names_only_the_limited_dimensions(
    ledger: Ledger,
) -> None:
    platform = await ledger.open("platform", None, Fixed(None, usd_to_pico(0.005)))
    with pytest.raises(BudgetExceeded) as usd_only:
        await ledger.open("run", platform, Fixed(None, usd_to_pico(0.01)))
    assert str(usd_only.value) == "'run' needs $0.010000 but 'platform' has only $0.005000 left"
    pool = await ledger.open("pool", None, Fixed(1_000, None))
    with pytest.raises(BudgetExceeded) as tokens_only:
        await ledger.open("run", pool, Fixed(5_000, None))
    assert (
        str(tokens_only.value) == "'run' needs 5,000 tokens but 'pool' has only 1,000 tokens left"
    )
    both = await ledger.open("both", None, Fixed(1_000, usd_to_pico(1)))
    with pytest.raises(BudgetExceeded) as caught:
        await ledger.open("run", both, Fixed(5_000, usd_to_pico(0.5)))
    assert str(caught.value) == (
        "'run' needs 5,000 tokens and $0.500000 but 'both' has only 1,000 tokens and $1.000000 left"
    )
    for account in (platform, pool, both):
        await ledger.close(account)


async def test_contract_misuse_is_refused(ledger: Ledger) -> None:
    with pytest.raises(LedgerError, match="Fixed"):
        await ledger.open("1", None, Share(1.0, 1.0))
    root = await ledger.open("1", None, Fixed(100, None))
    with pytest.raises(LedgerError, match="between 0 and 1"):
        await ledger.open("1.1", root, Draw(1.5))
    child = await ledger.open("1.1", root, Share(0.5, 0.5))
    held = await ledger.reserve(child, 10, 0, "execution")
    assert held is not None
    with pytest.raises(LedgerError, match="still open"):
        await ledger.close(child)
    with pytest.raises(LedgerError, match="still open"):
        await ledger.close(root)
    await ledger.settle(held, 5, 0)
    with pytest.raises(LedgerError, match="twice"):
        await ledger.release(held)
    await ledger.close(child)
    with pytest.raises(LedgerError, match="closed"):
        await ledger.reserve(child, 1, 0, "execution")
    with pytest.raises(LedgerError, match="closed"):
        await ledger.open("1.1.1", child, Draw(1.0))
    await ledger.close(root)


async def test_outstanding_counts_open_reservations(ledger: Ledger) -> None:
    root = await ledger.open("1", None, Fixed(None, usd_to_pico(1)))
    held = [await ledger.reserve(root, 10, 1_000, "execution") for _ in range(3)]
    out = await ledger.outstanding()
    assert (out.reservations, out.tokens, out.pico, out.accounts) == (3, 30, 3_000, 1)
    for reservation in held:
        assert reservation is not None
        await ledger.release(reservation)
    await ledger.close(root)
    out = await ledger.outstanding()
    assert (out.reservations, out.tokens, out.pico, out.accounts) == (0, 0, 0, 0)


def test_usd_is_counted_in_exact_pico_dollars() -> None:
    assert usd_to_pico(0.01) == 10**10
    assert usd_to_pico(0.1) * 3 == usd_to_pico(0.3)  # floats would say otherwise
    assert rate_to_pico(0.25) == 250_000
    assert rate_to_pico(0.0375) == 37_500
    assert rate_to_pico(1e-7) == 1  # rounded up: a price never becomes free
    assert pico_to_usd(usd_to_pico(12.5)) == 12.5


def test_budget_rejects_bad_values_with_a_clear_message() -> None:
    with pytest.raises(UserInputError, match="whole number"):
        Budget(tokens=-1)
    with pytest.raises(UserInputError, match="whole number"):
        Budget(tokens=1.5)  # type: ignore[arg-type]
    with pytest.raises(UserInputError, match="finite"):
        Budget(usd=float("nan"))
    with pytest.raises(UserInputError, match="finite"):
        Budget(usd=-0.5)
    assert str(Budget(tokens=1_000, usd=0.5)) == "1,000 tokens and $0.5"
    assert not Budget().limited


def test_step_weights_follow_the_policy_and_the_estimates() -> None:
    steps = [
        Step(id="a", title="a", instruction="a", kind="subgoal", estimate_tokens=1_000),
        Step(id="b", title="b", instruction="b", kind="subgoal", estimate_tokens=3_000),
        Step(id="c", title="c", instruction="c", kind="subgoal"),
        Step(id="t", title="t", instruction="t", tool="x", args={"k": 1}),
        Step(id="u", title="u", instruction="u", kind="subgoal", estimate_usd=0.5),
    ]
    plan = Plan(goal="g", steps=steps)
    assert step_work(steps[3]).direct
    assert step_weights(_needs(plan), "equal") == {"a": 1.0, "b": 1.0, "c": 1.0, "u": 1.0}
    # c and u have no token estimate: they weigh the mean of the others
    assert step_weights(_needs(plan), "weighted") == {"a": 1e3, "b": 3e3, "c": 2e3, "u": 2e3}
    usd_only = Plan(
        goal="g",
        steps=[
            Step(id="a", title="a", instruction="a", estimate_usd=0.2),
            Step(id="b", title="b", instruction="b", estimate_usd=0.6),
        ],
    )
    assert step_weights(_needs(usd_only), "weighted") == {"a": 0.2, "b": 0.6}
    bare = Plan(goal="g", steps=[Step(id="a", title="a", instruction="a")])
    assert step_weights(_needs(bare), "weighted") == {"a": 1.0}


def _needs(plan: Plan) -> dict[str, StepWork]:
    """The model-using steps of ``plan`` as the budget receives them."""
    return {s.id: w for s in plan.steps if not (w := step_work(s)).direct}
