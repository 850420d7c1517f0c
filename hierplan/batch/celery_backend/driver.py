"""The driver side of the Celery backend: ``hierplan batch --backend celery``.

The driver keeps up to ``--concurrency`` goals enqueued, follows their state in Redis, and
journals each finished goal in ``DIR``; when every goal is final it deletes the batch's keys.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from hierplan.batch.celery_backend.lease import REQUEUE, lease_key, lease_seconds
from hierplan.batch.celery_backend.protocol import (
    FINAL,
    QUEUE,
    TASK_NAME,
    done_key,
    goal_key,
    make_app,
)
from hierplan.batch.goals import BatchGoal
from hierplan.batch.runner import GoalOutcome
from hierplan.budgets.budget import Fixed, LedgerError
from hierplan.budgets.redis_ledger import RedisAccount, RedisLedger, connect
from hierplan.errors import UserInputError

if TYPE_CHECKING:
    from hierplan.batch.core import Batch

POLL_S = 0.2  # the driver's longest wait between looks at its goals' states


async def run_celery(batch: Batch) -> None:
    """Enqueue the batch's goals on Celery, at most ``concurrency`` at once, and journal each
    one as its state in Redis becomes final; then delete the batch's keys from Redis."""
    config = batch.config
    if config.broker is None:
        raise UserInputError("--backend celery needs --broker redis://HOST:PORT/DB")
    app = make_app(config.broker, config.visibility_timeout)
    ledger = RedisLedger(connect(config.broker), batch.meta["namespace"])
    client = ledger.client
    try:
        await anyio.to_thread.run_sync(client.ping)
    except Exception as exc:
        raise UserInputError(f"cannot reach Redis at {config.broker}: {exc}") from None
    rows = batch.journal.rows()
    following = {r.id: r.goal for r in rows if r.state == "running"}
    pending = [r.goal for r in rows if r.state == "pending"]
    if not following and not pending and batch.meta.get("root_account") is not None:
        # Resumed after every goal finished: at most the deletion of its keys was left to do.
        await forget_ledger(batch, ledger, str(batch.meta["root_account"]))
        return
    root = await _root_account(batch, ledger)
    namespace = batch.meta["namespace"]
    payload = {
        "redis": config.broker,
        "namespace": namespace,
        "root": root.id,
        "options": batch.meta["options"],
        "budget": batch.meta["budget"],
        "lease_s": lease_seconds(config.lease_s),
    }
    concurrency = batch.budget.concurrency
    runs: dict[str, int] = {}  # deliveries that started each goal, as last journaled
    while pending or following:
        while pending and len(following) < concurrency:
            goal = pending.pop(0)
            # Sent, then journaled, with no await in between (Ctrl-C cancels at an await): a
            # goal journaled as running always has its message, or a resume would wait for it
            # for ever. A kill between the two leaves it pending with its message sent; the
            # resume sends it again, and the later delivery is dropped while the earlier one
            # holds its lease (or takes the goal over once that lapsed).
            app.send_task(TASK_NAME, args=[{**payload, "goal": goal.to_json()}], queue=QUEUE)
            batch.journal.start(goal.id, (None, None))
            following[goal.id] = goal
        batch.refresh_panel()  # goals started since the last look are running now
        await anyio.to_thread.run_sync(_wait_for_news, client, namespace)
        states = await anyio.to_thread.run_sync(_states, client, namespace, list(following))
        batch.running_elsewhere = await anyio.to_thread.run_sync(_running, ledger, states)
        if not await anyio.to_thread.run_sync(client.exists, ledger.account_key(root)):
            # Its goals' messages went with it: waiting for them would never end.
            raise UserInputError(_ledger_lost(batch))
        for goal_id, state, leased in states:
            _count_attempts(batch, goal_id, state, runs)
            if state.get("state") in FINAL:
                _journal_final(batch, following.pop(goal_id), state)
                # The journal holds the record now: Redis keeps only the goal's figures, or
                # a long batch's records would fill its memory (nothing there expires).
                await anyio.to_thread.run_sync(client.hdel, goal_key(namespace, goal_id), "record")
            elif state.get("state") in HELD and not leased:
                goal = following[goal_id]
                await anyio.to_thread.run_sync(_requeue, app, client, payload, goal)
    await forget_ledger(batch, ledger, root.id)


HELD = ("claimed", "running", "waiting")
"""The states of a goal that a delivery holds, under a lease its worker renews."""


def _requeue(app: Any, client: Any, payload: dict[str, Any], goal: BatchGoal) -> bool:
    """Send ``goal`` to the queue again: the delivery that held it let its lease lapse (its
    worker died, or lost Redis for a whole lease). Returns whether the goal was queued again.

    Sent first, then marked queued for the new task (by the script ``REQUEUE`` of
    :mod:`~hierplan.batch.celery_backend.lease`, which finds the lease still lapsed,
    atomically): a driver stopped between the two leaves a message that claims the goal (its
    lease has lapsed) and a resume that sends another (dropped while the first holds the
    goal). A message sent while the lease was renewed meanwhile, or the goal finished, is
    dropped when it is delivered."""
    namespace = payload["namespace"]
    task_id = uuid.uuid4().hex
    app.send_task(
        TASK_NAME, args=[{**payload, "goal": goal.to_json()}], queue=QUEUE, task_id=task_id
    )
    mark = client.register_script(REQUEUE)
    keys = [goal_key(namespace, goal.id), lease_key(namespace, goal.id)]
    return bool(mark(keys=keys, args=[task_id]))


def _count_attempts(
    batch: Batch, goal_id: str, state: dict[str, str], journaled: dict[str, int]
) -> None:
    """Journal how many deliveries have started the goal so far, each one an attempt (the
    first is the attempt journaled when the goal was sent); ``journaled`` keeps what was."""
    runs = int(state.get("runs") or 0)
    if runs > max(1, journaled.get(goal_id, 0)):
        batch.journal.count_attempts(goal_id, runs)
        journaled[goal_id] = runs


async def _root_account(batch: Batch, ledger: RedisLedger) -> RedisAccount:
    """The batch's root account in Redis: opened (and journaled) on the first run, found
    again on a resume."""
    root_id = batch.meta.get("root_account")
    if root_id is None:
        budget = batch.budget
        root = await ledger.open("batch", None, Fixed(budget.tokens, budget.pico))
        batch.journal.set_meta("root_account", root.id)
        return root
    try:
        return await ledger.account(root_id)
    except LedgerError:
        raise UserInputError(_ledger_lost(batch)) from None


async def forget_ledger(batch: Batch, ledger: RedisLedger, root_id: str) -> None:
    """Once every goal is journaled as final: keep the figures of the root account
    (``root_id``) in the journal (``meta.ledger``), then delete every key of the batch's
    namespace from Redis.

    Deleted rather than left to expire: nothing needs them any more, and a time to live would
    have to outlast a driver that is stopped while workers still run its goals, or those goals'
    accounts would vanish under them and their calls go unchecked. The journal holds every
    goal's outcome, spend and record, so a resume of the finished batch runs nothing and needs
    nothing from Redis (it only finishes a deletion that was cut short). What may still reach
    Redis from the batch is refused without writing: a message delivered late finds no root
    account and is dropped (``_CLAIM``); a delivery fenced out earlier and still running finds
    its account gone, so its calls are refused (as they were once its account was written off)
    and its result is dropped (``_FENCED_SET`` finds no fence).
    """
    try:
        root = await ledger.account(root_id)
    except LedgerError:
        pass  # deleted already, after its figures went to the journal
    else:
        batch.journal.set_meta("ledger", _root_figures(await ledger.balance(root)))
    with anyio.CancelScope(shield=True):  # a Ctrl-C now would leave half the keys
        await anyio.to_thread.run_sync(ledger.drop)


def _journal_final(batch: Batch, goal: BatchGoal, state: dict[str, str]) -> None:
    """Journal a goal that a worker left in a final state (``state``: its Redis hash)."""

    def amount(name: str) -> int:
        return int(state.get(name) or 0)

    outcome = GoalOutcome(
        state["state"],
        state.get("status") or "",
        state.get("reason") or None,
        state.get("record") or None,
    )
    spent = (amount("spent_tokens"), amount("spent_pico"))
    batch.record_finished(
        goal, outcome, spent, prior=(amount("prior_tokens"), amount("prior_pico"))
    )


def _ledger_lost(batch: Batch) -> str:
    """Why a batch cannot go on when its ledger is gone from Redis, and what to do."""
    return (
        f"Redis at {batch.config.broker} does not hold the ledger of the batch in "
        f"{batch.config.out} (namespace {batch.meta['namespace']}): the batch was started with "
        "another --broker, or Redis lost its data (restarted without persistence, flushed, or "
        "keys evicted under maxmemory), and with it the goals' messages and what running goals "
        "spent. Resume with the --broker the batch was started with; otherwise run the goals "
        "the journal has not finished as a new batch (another --out), on a Redis that keeps its "
        "data (appendonly yes, maxmemory-policy noeviction)"
    )


def _wait_for_news(client: Any, namespace: str) -> None:
    """Block until a worker announces a finished goal, or ``POLL_S`` passes; then clear the
    announcements (the states read next include every goal announced so far)."""
    key = done_key(namespace)
    if client.blpop([key], POLL_S) is not None:
        client.delete(key)


GoalState = tuple[str, dict[str, str], bool]
"""A goal's id, its hash in Redis, and whether a delivery's lease on it holds."""


def _states(client: Any, namespace: str, goal_ids: list[str]) -> list[GoalState]:
    pipe = client.pipeline(transaction=False)
    for goal_id in goal_ids:
        pipe.hgetall(goal_key(namespace, goal_id))
        pipe.exists(lease_key(namespace, goal_id))
    replies = pipe.execute()
    return [
        (goal_id, replies[2 * i], bool(replies[2 * i + 1])) for i, goal_id in enumerate(goal_ids)
    ]


def _running(ledger: RedisLedger, states: list[GoalState]) -> tuple[int, int]:
    """What the goals not yet final hold and have spent on the workers, with what their
    earlier deliveries spent, in tokens and pico-dollars."""
    tokens = pico = 0
    pipe = ledger.client.pipeline(transaction=False)
    for _, state, _ in states:
        if state.get("state") in FINAL:
            continue  # journaled now, with its spend
        tokens += int(state.get("prior_tokens") or 0)
        pico += int(state.get("prior_pico") or 0)
        if state.get("account"):
            pipe.hmget(ledger.account_key(state["account"]), ["st", "sp", "rt", "rp"])
    for spent_t, spent_p, held_t, held_p in pipe.execute():
        tokens += int(spent_t or 0) + int(held_t or 0)
        pico += int(spent_p or 0) + int(held_p or 0)
    return tokens, pico


def _root_figures(balance: Any) -> dict[str, Any]:
    return {
        "spent_tokens": balance.spent_tokens,
        "spent_pico": balance.spent_pico,
        "granted_tokens": balance.granted_tokens,
        "granted_pico": balance.granted_pico,
    }
