"""The Celery backend: goals run on ``hierplan worker`` processes, the budget lives in Redis.

The driver (``hierplan batch --backend celery``) keeps up to ``--concurrency`` goals enqueued,
follows their state in Redis, and journals each finished goal in ``DIR``. Workers use the
threads pool with one anyio portal (an event loop in a thread) per process: each task thread
hands its goal to the portal, so the goals of a process share one loop.

Messages are acknowledged late (after the goal ends), so a goal whose worker dies is delivered
again once the broker's visibility timeout has passed: set it longer than the longest goal.
Every delivery first **claims** the goal in Redis (a Lua script that fences out any earlier
delivery still running), **writes off** the account of an earlier delivery that did not finish
(the calls it held count as spent), and then is granted a new account (see
:mod:`hierplan.batch.budget`). A goal whose cap does not fit while others hold grants is
retried a moment later; one whose minimum cannot be covered at all is recorded as skipped.
A delivery that was fenced out finds its account closed: its calls are refused and its result is
dropped, so a goal is never finished twice.

Redis keys of a batch share its namespace: the ledger's accounts, and one hash per goal
(``{ns}:g:<goal id>``) with its state, fence, account, spend and record. When every goal is
journaled as final, the driver keeps the root account's figures in the journal and deletes every
key of the namespace (see :func:`forget_ledger` for why that is safe); a resume of a finished
batch has nothing left to run and needs none of them.
"""

from __future__ import annotations

import os
import socket
import tempfile
import threading
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.from_thread
import anyio.to_thread

from hierplan.batch.budget import GoalLedger, goal_cap, goal_minimum, grant_goal
from hierplan.batch.goals import BatchGoal
from hierplan.batch.runner import GoalOutcome, RunOptions, inner_budget, run_goal
from hierplan.budgets.budget import Fixed, LedgerError
from hierplan.budgets.redis_ledger import RedisAccount, RedisLedger, connect
from hierplan.core.instrument import Instrument
from hierplan.errors import UserInputError

if TYPE_CHECKING:
    from celery import Celery

    from hierplan.batch.core import Batch

TASK_NAME = "hierplan.batch.goal"
QUEUE = "hierplan"
CELERY_INSTALL_HINT = "pip install 'hierplan[celery]'"
POLL_S = 0.2  # the driver's longest wait between looks at its goals' states
WAIT_RETRY_S = 0.5
ERROR_RETRY_S = 5.0  # a delivery that could not reach Redis tries again after this

# KEYS: the goal's hash, the batch's root account. A delivery of a batch whose keys are gone
# (it finished and deleted them, or Redis lost them) writes nothing: the driver is done, or says
# the ledger was lost.
_CLAIM = r"""
local g = KEYS[1]
if redis.call('EXISTS', KEYS[2]) == 0 then return 'gone' end
local state = redis.call('HGET', g, 'state')
if state == 'succeeded' or state == 'failed' or state == 'skipped' then return 'final' end
local old = redis.call('HGET', g, 'account')
if old and old ~= '' then redis.call('SADD', g .. ':old', old) end
redis.call('HSET', g, 'fence', ARGV[1], 'account', '', 'state', 'claimed', 'worker', ARGV[2])
redis.call('HINCRBY', g, 'deliveries', 1)
return 'ok'
"""

# ARGV: account id, tokens, pico. Counts a written-off account's spend once.
_COUNT_OLD = r"""
local g = KEYS[1]
if redis.call('SREM', g .. ':old', ARGV[1]) == 1 then
  redis.call('HINCRBY', g, 'prior_tokens', ARGV[2])
  redis.call('HINCRBY', g, 'prior_pico', ARGV[3])
end
return 'ok'
"""

# KEYS: the goal's hash, the batch's list of finished goals. ARGV: fence, goal id, then
# field/value pairs to set if the fence still holds. A goal left in a final state is announced
# on the list, which wakes the driver.
_FENCED_SET = r"""
local g = KEYS[1]
if redis.call('HGET', g, 'fence') ~= ARGV[1] then return 'superseded' end
for i = 3, #ARGV, 2 do redis.call('HSET', g, ARGV[i], ARGV[i + 1]) end
local state = redis.call('HGET', g, 'state')
if state == 'succeeded' or state == 'failed' or state == 'skipped' then
  redis.call('RPUSH', KEYS[2], ARGV[2])
end
return 'ok'
"""


def _require_celery() -> None:
    try:
        import celery  # noqa: F401
    except ImportError:  # pragma: no cover - the extra is installed in development
        raise UserInputError(
            f"the Celery backend needs the celery extra: {CELERY_INSTALL_HINT}"
        ) from None


def transport_options(visibility_timeout: float) -> dict[str, Any]:
    """Broker options: the visibility timeout, and unacknowledged messages of dead workers
    looked for often enough that they come back soon after it has passed."""
    return {
        "visibility_timeout": visibility_timeout,
        "unacked_restore_interval": max(1, min(10, int(visibility_timeout // 4))),
        "unacked_restore_throttle": 1,
    }


def make_app(broker: str, visibility_timeout: float = 3600.0) -> Celery:
    """The Celery app of hierplan's batch workers (no result backend: state is in Redis)."""
    _require_celery()
    from celery import Celery

    app: Celery = Celery("hierplan", broker=broker, set_as_current=False)
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_acks_on_failure_or_timeout=True,
        worker_prefetch_multiplier=1,
        task_ignore_result=True,
        task_serializer="json",
        accept_content=["json"],
        task_default_queue=QUEUE,
        broker_transport_options=transport_options(visibility_timeout),
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        worker_pool="threads",
    )
    # max_retries=None: a goal waiting for budget to come back retries until it can start.
    app.task(name=TASK_NAME, bind=True, acks_late=True, max_retries=None)(_goal_task)
    return app


# -- the worker side -------------------------------------------------------------------------


class _Worker:
    """Per-process state of a worker: its portal, Redis clients and settings."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.portal: anyio.from_thread.BlockingPortal | None = None
        self.portal_cm: AbstractContextManager[anyio.from_thread.BlockingPortal] | None = None
        self.ledgers: dict[tuple[str, str], RedisLedger] = {}
        self.workdir = Path(tempfile.gettempdir()) / f"hierplan-worker-{os.getpid()}"
        self.instruments: list[Instrument] = []
        self.name = f"{socket.gethostname()}:{os.getpid()}"

    def get_portal(self) -> anyio.from_thread.BlockingPortal:
        """The process's one portal, started on first use."""
        with self.lock:
            if self.portal is None:
                self.portal_cm = anyio.from_thread.start_blocking_portal()
                self.portal = self.portal_cm.__enter__()
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
                self.portal_cm.__exit__(None, None, None)
                self.portal_cm = self.portal = None


WORKER = _Worker()


def _goal_task(task: Any, payload: dict[str, Any]) -> str:
    """The Celery task: run one goal in the process's portal (the goal waits when its grant
    must wait for other goals' budgets to come back)."""
    try:
        outcome = WORKER.get_portal().call(partial(work_on_goal, payload, WORKER))
    except Exception as exc:
        # Redis could not be reached to record the goal. Acknowledged as failed, the message
        # would be gone while the driver waits for the goal: it is delivered again instead,
        # and that delivery fences this one out and writes off what it was granted.
        raise task.retry(exc=exc, countdown=ERROR_RETRY_S) from exc
    if outcome == "wait":
        raise task.retry(countdown=WAIT_RETRY_S)
    return outcome


def goal_key(namespace: str, goal_id: str) -> str:
    """The Redis hash of a goal's state."""
    return f"{{{namespace}}}:g:{goal_id}"


def done_key(namespace: str) -> str:
    """The Redis list where workers announce goals that finished."""
    return f"{{{namespace}}}:done"


async def work_on_goal(payload: dict[str, Any], worker: _Worker) -> str:
    """Claim, write off earlier deliveries, get a grant, run, close, finish (fenced).

    A failure of this delivery itself (the batch's ledger gone from Redis, a Redis error
    mid-way) is recorded as the goal's failure, fenced like any outcome: the driver follows
    the goal until it is final, and the message is acknowledged either way."""
    ledger = worker.ledger(payload["redis"], payload["namespace"])
    client = ledger.client
    goal = BatchGoal.from_json(payload["goal"])
    key = goal_key(payload["namespace"], goal.id)
    fence = uuid.uuid4().hex

    def fenced_set(*fields: str) -> Any:
        keys = [key, done_key(payload["namespace"])]
        return client.register_script(_FENCED_SET)(keys=keys, args=[fence, goal.id, *fields])

    claim = partial(
        client.register_script(_CLAIM),
        keys=[key, ledger.account_key(payload["root"])],
        args=[fence, worker.name],
    )
    claimed = await anyio.to_thread.run_sync(claim)
    if claimed == "final":
        return "duplicate"
    if claimed == "gone":
        return "gone"
    opened: list[RedisAccount] = []
    try:
        return await _run_claimed(payload, worker, ledger, goal, fence, opened, fenced_set)
    except Exception as exc:
        reason = f"the worker failed: {type(exc).__name__}: {exc}"
    # The account this delivery was granted returns what it did not spend; its calls still
    # held count as spent. If Redis cannot be reached for this either, the task fails and is
    # delivered again (see _goal_task), and that delivery writes the account off.
    spent = (0, 0)
    for account in opened:
        balance = await ledger.write_off(account)
        spent = (balance.spent_tokens, balance.spent_pico)
    failed = GoalOutcome("failed", "error", reason, None)
    return str(await anyio.to_thread.run_sync(fenced_set, *_finish_fields(failed, spent)))


async def _run_claimed(
    payload: dict[str, Any],
    worker: _Worker,
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
    olds = await anyio.to_thread.run_sync(client.smembers, f"{key}:old")
    count_old = client.register_script(_COUNT_OLD)
    for old in olds:
        balance = await ledger.write_off(await ledger.account(str(old)))
        args = [str(old), str(balance.spent_tokens), str(balance.spent_pico)]
        await anyio.to_thread.run_sync(partial(count_old, keys=[key], args=args))
    root = await ledger.account(payload["root"])
    options = RunOptions.from_dict(payload["options"])
    budget = _budget(payload)
    cap = goal_cap(goal, budget)
    minimum = goal_minimum(goal, options.model, options.pricing([goal]), options.settings(goal))
    decision, account, grant = await grant_goal(ledger, root, goal.id, cap, minimum)
    if decision == "wait":
        return "wait"
    if decision == "skip" or not isinstance(account, RedisAccount):
        done = _finish_fields(GoalOutcome("skipped", "not_started", _SKIP_REASON, None), (0, 0))
        return str(await anyio.to_thread.run_sync(fenced_set, *done))
    opened.append(account)
    started = await anyio.to_thread.run_sync(fenced_set, "account", account.id, "state", "running")
    if started != "ok":
        await ledger.write_off(account)
        return "superseded"
    outcome = await run_goal(
        goal,
        options,
        GoalLedger(ledger, account),
        inner_budget(grant, cap),
        # A directory per delivery: a goal delivered again while an earlier delivery still
        # runs (it outlived the visibility timeout) must not set up its files over that one's.
        worker.workdir / payload["namespace"] / goal.id / fence[:12],
        worker.instruments,
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


def _budget(payload: dict[str, Any]) -> Any:
    from hierplan.batch.budget import BatchBudget

    b = payload["budget"]
    return BatchBudget(b["tokens"], b["pico"], b["concurrency"], b["goal_tokens"], b["goal_pico"])


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
    app = make_app(broker, visibility_timeout)
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


# -- the driver side -------------------------------------------------------------------------


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
    }
    concurrency = batch.budget.concurrency
    while pending or following:
        while pending and len(following) < concurrency:
            goal = pending.pop(0)
            # Sent, then journaled, with no await in between (Ctrl-C cancels at an await): a
            # goal journaled as running always has its message, or a resume would wait for it
            # for ever. A kill between the two leaves it pending with its message sent; the
            # resume sends it again, and the later delivery fences out the earlier one.
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
        for goal_id, state in states:
            if state.get("state") in ("succeeded", "failed", "skipped"):
                _journal_final(batch, following.pop(goal_id), state)
                # The journal holds the record now: Redis keeps only the goal's figures, or
                # a long batch's records would fill its memory (nothing there expires).
                await anyio.to_thread.run_sync(client.hdel, goal_key(namespace, goal_id), "record")
    await forget_ledger(batch, ledger, root.id)


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


def _states(client: Any, namespace: str, goal_ids: list[str]) -> list[tuple[str, dict[str, str]]]:
    pipe = client.pipeline(transaction=False)
    for goal_id in goal_ids:
        pipe.hgetall(goal_key(namespace, goal_id))
    return list(zip(goal_ids, pipe.execute(), strict=True))


def _running(ledger: RedisLedger, states: list[tuple[str, dict[str, str]]]) -> tuple[int, int]:
    """What the goals not yet final hold and have spent on the workers, with what their
    earlier deliveries spent, in tokens and pico-dollars."""
    tokens = pico = 0
    pipe = ledger.client.pipeline(transaction=False)
    for _, state in states:
        if state.get("state") in ("succeeded", "failed", "skipped"):
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
