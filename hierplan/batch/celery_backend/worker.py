"""The worker side of the Celery backend: ``hierplan worker`` and the task that runs one goal.

Workers use Celery's threads pool with one anyio portal (an event loop in a thread) per
process: each task thread hands its goal to the portal, so the goals of a process share one
loop. See :mod:`hierplan.batch.celery_backend` for how a delivery claims, runs and finishes a
goal.
"""

from __future__ import annotations

import os
import socket
import tempfile
import threading
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.from_thread
import anyio.to_thread

from hierplan.batch.budget import BatchBudget, GoalLedger, goal_cap, goal_minimum, grant_goal
from hierplan.batch.celery_backend.lease import DEFAULT_LEASE_S, Heartbeat, Lease, lease_key
from hierplan.batch.celery_backend.protocol import (
    CLAIM,
    COUNT_OLD,
    FENCED_SET,
    QUEUE,
    START,
    TASK_NAME,
    done_key,
    goal_key,
    make_app,
)
from hierplan.batch.goals import BatchGoal
from hierplan.batch.runner import GoalOutcome, RunOptions, inner_budget, run_goal
from hierplan.batch.toolsets import SharedToolsets
from hierplan.budgets.budget import LedgerError
from hierplan.budgets.redis_ledger import Guard, GuardFailed, RedisAccount, RedisLedger, connect
from hierplan.core.instrument import Instrument

if TYPE_CHECKING:
    from celery import Celery

WAIT_RETRY_S = 0.5
ERROR_RETRY_S = 5.0  # a delivery that could not reach Redis tries again after this


class WorkerState:
    """Per-process state of a worker: its portal, Redis clients, heartbeat and settings."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.portal: anyio.from_thread.BlockingPortal | None = None
        self.portal_cm: AbstractContextManager[anyio.from_thread.BlockingPortal] | None = None
        self.ledgers: dict[tuple[str, str], RedisLedger] = {}
        self.workdir = Path(tempfile.gettempdir()) / f"hierplan-worker-{os.getpid()}"
        self.instruments: list[Instrument] = []
        self.name = f"{socket.gethostname()}:{os.getpid()}"
        self.heartbeat = Heartbeat()
        # The servers this process's goals share (tools entries marked shared), held in the
        # portal's loop until the worker stops.
        self.shared = SharedToolsets()

    def get_portal(self) -> anyio.from_thread.BlockingPortal:
        """The process's one portal, started on first use."""
        with self.lock:
            if self.portal is None:
                self.portal_cm = anyio.from_thread.start_blocking_portal()
                self.portal = self.portal_cm.__enter__()
                self.portal.start_task(self.shared.serve)
            return self.portal

    def ledger(self, url: str, namespace: str) -> RedisLedger:
        """The batch's Redis ledger (one client per batch per process)."""
        with self.lock:
            found = self.ledgers.get((url, namespace))
            if found is None:
                found = self.ledgers[(url, namespace)] = RedisLedger(connect(url), namespace)
            return found

    def stop(self) -> None:
        """Stop the portal (at worker shutdown)."""
        with self.lock:
            if self.portal_cm is not None:
                if self.portal is not None:
                    self.portal.call(self.shared.close)
                self.portal_cm.__exit__(None, None, None)
                self.portal_cm = self.portal = None


WORKER = WorkerState()


@dataclass(frozen=True, slots=True)
class Delivery:
    """Which message a delivery of a goal is: its Celery task's id, and how many times that
    task was retried (a retry goes on with the goal its task holds; a copy of a message that
    the broker restored does not, while the delivery it copies keeps its lease)."""

    task_id: str
    retries: int = 0


def _goal_task(task: Any, payload: dict[str, Any]) -> str:
    """The Celery task: run one goal in the process's portal (the goal waits when its grant
    must wait for other goals' budgets to come back)."""
    delivery = Delivery(str(task.request.id), int(task.request.retries or 0))
    try:
        outcome = WORKER.get_portal().call(partial(work_on_goal, payload, WORKER, delivery))
    except Exception as exc:
        # Redis could not be reached to record the goal. Acknowledged as failed, the message
        # would be gone while the driver waits for the goal: it is delivered again instead,
        # and that delivery fences this one out and writes off what it was granted.
        raise task.retry(exc=exc, countdown=ERROR_RETRY_S) from exc
    if outcome == "wait":
        raise task.retry(countdown=WAIT_RETRY_S)
    return outcome


async def work_on_goal(
    payload: dict[str, Any], worker: WorkerState, delivery: Delivery | None = None
) -> str:
    """Claim (with a lease the worker's heartbeat renews), write off earlier deliveries, get a
    grant, run, close, finish (fenced). ``delivery``: the message this is (a fresh one if not
    given).

    A failure of this delivery itself (the batch's ledger gone from Redis, a Redis error
    mid-way) is recorded as the goal's failure, fenced like any outcome: the driver follows
    the goal until it is final, and the message is acknowledged either way."""
    delivery = delivery or Delivery(uuid.uuid4().hex)
    namespace = payload["namespace"]
    ledger = worker.ledger(payload["redis"], namespace)
    client = ledger.client
    goal = BatchGoal.from_json(payload["goal"])
    key, leased = goal_key(namespace, goal.id), lease_key(namespace, goal.id)
    fence = uuid.uuid4().hex
    # A message of an older driver names no lease: it gets the default.
    lease = Lease(client, key, leased, fence, float(payload.get("lease_s") or DEFAULT_LEASE_S))

    def fenced_set(*fields: str, holder: str = fence) -> Any:
        keys = [key, done_key(namespace), leased]
        return client.register_script(FENCED_SET)(keys=keys, args=[holder, goal.id, *fields])

    claim = partial(
        client.register_script(CLAIM),
        keys=[key, ledger.account_key(payload["root"]), leased],
        args=[fence, worker.name, delivery.task_id, delivery.retries, int(lease.seconds * 1000)],
    )
    claimed = await anyio.to_thread.run_sync(claim)
    if claimed in ("final", "leased"):
        return "duplicate"
    if claimed == "gone":
        return "gone"
    worker.heartbeat.hold(lease)
    try:
        return await _run_delivery(payload, worker, ledger, goal, fence, fenced_set)
    finally:
        worker.heartbeat.release(lease)


async def _run_delivery(
    payload: dict[str, Any],
    worker: WorkerState,
    ledger: RedisLedger,
    goal: BatchGoal,
    fence: str,
    fenced_set: Callable[..., Any],
) -> str:
    """The goal claimed under ``fence``: run it, or record this delivery's own failure."""
    opened: list[RedisAccount] = []
    try:
        return await _run_claimed(payload, worker, ledger, goal, fence, opened, fenced_set)
    except Exception as exc:
        reason = f"the worker failed: {type(exc).__name__}: {exc}"
    # The account this delivery was granted returns what it did not spend; its calls still
    # held count as spent. If Redis cannot be reached for this either, the task fails and is
    # delivered again (see _goal_task), and that delivery writes the account off.
    #
    # The fence is retired first, checked and changed in one step: an open of this delivery
    # whose reply was lost (a timeout, a reset connection), even one Redis runs only later, is
    # refused by its guard from then on, so the goal's hash now names all it ever opened.
    ending = f"{fence}:failed"
    if await anyio.to_thread.run_sync(partial(fenced_set, "fence", ending)) == "ok":
        key = goal_key(payload["namespace"], goal.id)
        named = await anyio.to_thread.run_sync(ledger.client.hget, key, "account")
        if named and all(account.id != named for account in opened):
            opened.append(await ledger.account(str(named)))
        await _write_off_old(ledger, key)  # if that failed before Redis ran it
    spent = (0, 0)
    for account in opened:
        balance = await ledger.write_off(account)
        spent = (balance.spent_tokens, balance.spent_pico)
    failed = GoalOutcome("failed", "error", reason, None)
    fields = _finish_fields(failed, spent)
    return str(await anyio.to_thread.run_sync(partial(fenced_set, *fields, holder=ending)))


async def _write_off_old(ledger: RedisLedger, key: str) -> None:
    """Write off the accounts of the goal's earlier deliveries (``{key}:old``), counting what
    each spent once in the goal's prior spend."""
    client = ledger.client
    olds = await anyio.to_thread.run_sync(client.smembers, f"{key}:old")
    count_old = client.register_script(COUNT_OLD)
    for old in olds:
        balance = await ledger.write_off(await ledger.account(str(old)))
        args = [str(old), str(balance.spent_tokens), str(balance.spent_pico)]
        await anyio.to_thread.run_sync(partial(count_old, keys=[key], args=args))


async def _run_claimed(
    payload: dict[str, Any],
    worker: WorkerState,
    ledger: RedisLedger,
    goal: BatchGoal,
    fence: str,
    opened: list[RedisAccount],
    fenced_set: Callable[..., Any],
) -> str:
    """The rest of :func:`work_on_goal`, once the goal is claimed under ``fence``
    (``fenced_set`` writes the goal's fields while the claim holds); the account it is granted
    goes in ``opened``."""
    client = ledger.client
    key = goal_key(payload["namespace"], goal.id)
    await _write_off_old(ledger, key)
    root = await ledger.account(payload["root"])
    options = RunOptions.from_dict(payload["options"])
    budget = _budget(payload)
    cap = goal_cap(goal, budget)
    minimum = goal_minimum(goal, options.model, options.pricing([goal]), options.settings(goal))
    # The account is named in the goal's hash as it opens, while this delivery holds the goal:
    # a delivery that dies before it starts the goal leaves an account the next one writes off.
    guard = Guard(key, "fence", fence, "account")
    try:
        decision, account, grant = await grant_goal(
            ledger, root, goal.id, cap, minimum, opener=partial(ledger.open, guard=guard)
        )
    except GuardFailed:
        return "superseded"
    if decision == "wait":
        # The task is retried in a moment; its claim has just set the lease, which covers the
        # gap (the retry claims the goal as this task's; if its worker dies first, the lease
        # lapses and the driver queues the goal again).
        await anyio.to_thread.run_sync(fenced_set, "state", "waiting")
        return "wait"
    if decision == "skip" or not isinstance(account, RedisAccount):
        done = _finish_fields(GoalOutcome("skipped", "not_started", _SKIP_REASON, None), (0, 0))
        return str(await anyio.to_thread.run_sync(fenced_set, *done))
    opened.append(account)
    start = client.register_script(START)
    started = await anyio.to_thread.run_sync(partial(start, keys=[key], args=[fence, account.id]))
    if started != "ok":
        await ledger.write_off(account)
        return "superseded"
    outcome = await run_goal(
        goal,
        options,
        GoalLedger(ledger, account),
        inner_budget(grant, cap),
        # A directory per delivery: a goal delivered again while an earlier delivery still
        # runs (presumed dead when its lease lapsed) must not set up its files over that one's.
        worker.workdir / payload["namespace"] / goal.id / fence[:12],
        worker.instruments,
        shared=worker.shared,
    )
    try:
        balance = await ledger.close(account)
    except LedgerError:
        if await anyio.to_thread.run_sync(fenced_set) != "ok":
            return "superseded"  # written off by a later delivery, which counted the spend
        # Still this delivery's goal, with a call whose settlement Redis lost (it erred
        # mid-call): the account cannot close with it open, so it is written off, the call
        # counted at its worst case.
        balance = await ledger.write_off(account)
    fields = _finish_fields(outcome, (balance.spent_tokens, balance.spent_pico))
    return str(await anyio.to_thread.run_sync(fenced_set, *fields))


_SKIP_REASON = "budget: what the batch has left cannot cover the goal's minimum"


def _finish_fields(outcome: GoalOutcome, spent: tuple[int, int]) -> list[str]:
    return [
        "state",
        outcome.state,
        "status",
        outcome.status,
        "reason",
        outcome.reason or "",
        "spent_tokens",
        str(spent[0]),
        "spent_pico",
        str(spent[1]),
        "record",
        outcome.record or "",
    ]


def _budget(payload: dict[str, Any]) -> BatchBudget:
    b = payload["budget"]
    return BatchBudget(b["tokens"], b["pico"], b["concurrency"], b["goal_tokens"], b["goal_pico"])


def worker_app(broker: str, visibility_timeout: float = 3600.0) -> Celery:
    """The Celery app of a worker: :func:`~hierplan.batch.celery_backend.protocol.make_app`
    with the goal task registered."""
    app = make_app(broker, visibility_timeout)
    # max_retries=None: a goal waiting for budget to come back retries until it can start.
    app.task(name=TASK_NAME, bind=True, acks_late=True, max_retries=None)(_goal_task)
    return app


def run_worker(
    broker: str,
    *,
    concurrency: int = 4,
    visibility_timeout: float = 3600.0,
    workdir: Path | None = None,
    instruments: list[Instrument] | None = None,
    loglevel: str = "INFO",
) -> None:
    """Start a Celery worker for batch goals (blocks until the worker stops)."""
    from celery import signals

    # Celery would take any other URL for a broker of its own (a bare host:port for RabbitMQ)
    # and retry it for minutes; the ledger needs Redis, as the batch's driver does.
    connect(broker).close()
    app = worker_app(broker, visibility_timeout)
    if workdir is not None:
        WORKER.workdir = workdir
    WORKER.instruments = instruments or []
    signals.worker_shutdown.connect(lambda **_: WORKER.stop(), weak=False)
    app.worker_main(
        [
            "worker",
            "--pool=threads",
            f"--concurrency={concurrency}",
            f"--loglevel={loglevel}",
            f"--hostname=hierplan-{WORKER.name.replace(':', '-')}@%h",
            f"--queues={QUEUE}",
            "--without-gossip",
            "--without-mingle",
        ]
    )
