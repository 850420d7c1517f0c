"""Leases of Celery goals, against Redis: one delivery holds a goal at a time, a goal whose
lease lapsed is queued again, and what a dead delivery spent is counted once."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis
from redis_support import require_redis
from typer.testing import CliRunner

from hierplan.batch import BatchConfig, RunOptions, parse_goals
from hierplan.batch.celery_backend import Delivery, WorkerState, goal_key, lease_key, work_on_goal
from hierplan.batch.celery_backend.lease import REQUEUE, Lease, lease_seconds
from hierplan.batch.celery_backend.protocol import CLAIM, START
from hierplan.budgets.budget import Account, Balance, Fixed
from hierplan.budgets.redis_ledger import Guard, GuardFailed, RedisAccount, RedisLedger
from hierplan.cli import app
from hierplan.cli import batch as cli_batch
from hierplan.errors import UserInputError


def _payload(url: str, namespace: str, root: str) -> dict[str, Any]:
    goal = parse_goals('{"suite": "game24", "task": 0, "id": "g"}')[0]
    budget = {"tokens": None, "pico": 10**12, "concurrency": 1}
    return {
        "redis": url,
        "namespace": namespace,
        "root": root,
        "options": RunOptions(sim_latency_scale=0).to_dict(),
        "budget": {**budget, "goal_tokens": None, "goal_pico": None},
        "goal": goal.to_json(),
        "lease_s": 60,
    }


class _Goal:
    """The goal ``g`` of a batch in Redis, and the scripts a delivery and the driver run on it."""

    def __init__(self) -> None:
        self.ledger = RedisLedger(require_redis().url)
        self.client = self.ledger.client
        self.root = anyio.run(self.ledger.open, "batch", None, Fixed(None, 10**12))
        self.key = goal_key(self.ledger.namespace, "g")
        self.lease = lease_key(self.ledger.namespace, "g")

    def claim(self, task_id: str, retries: int, fence: str) -> str:
        keys = [self.key, self.ledger.account_key(self.root), self.lease]
        args: list[str | int] = [fence, "worker", task_id, retries, 60_000]
        return str(self.client.register_script(CLAIM)(keys=keys, args=args))

    def requeue(self, task_id: str) -> int:
        requeue = self.client.register_script(REQUEUE)
        return int(requeue(keys=[self.key, self.lease], args=[task_id]))

    def field(self, name: str) -> str | None:
        value = self.client.hget(self.key, name)
        return None if value is None else str(value)

    def payload(self) -> dict[str, Any]:
        """The message a delivery of the goal gets."""
        return _payload(require_redis().url, self.ledger.namespace, self.root.id)

    def worker(self, workdir: Path, ledger: RedisLedger | None = None) -> WorkerState:
        """A worker process's state, working in ``workdir``, whose ledger of the batch is
        ``ledger`` (one that fails on purpose) if given."""
        worker = WorkerState()
        worker.workdir = workdir
        if ledger is not None:
            worker.ledgers[(require_redis().url, self.ledger.namespace)] = ledger
        return worker

    def died_holding(self, pico: int) -> RedisAccount:
        """A delivery claims the goal, is granted an account, has a call of ``pico`` in flight,
        and dies: its lease lapses and the driver queues the goal again for task ``t2``."""
        assert self.claim("t1", 0, "f1") == "ok"
        account = anyio.run(self.ledger.open, "g", self.root, Fixed(None, 10**10))
        assert anyio.run(self.ledger.reserve, account, 100, pico, "planning") is not None
        start = self.client.register_script(START)
        assert start(keys=[self.key], args=["f1", account.id]) == "ok"
        self.client.delete(self.lease)
        assert self.requeue("t2") == 1
        return account


def test_one_delivery_holds_a_goal_and_a_lapsed_lease_hands_it_to_the_task_queued_for_it() -> None:
    goal = _Goal()
    try:
        assert goal.claim("t1", 0, "f1") == "ok"
        assert goal.client.pttl(goal.lease) > 0  # the claim took the lease
        # A copy of t1's message (the broker restored it after its visibility timeout), or a
        # second message of the goal (a resumed driver sent it again): dropped, t1 goes on.
        assert goal.claim("t1", 0, "f2") == "leased"
        assert goal.claim("t2", 0, "f3") == "leased"
        assert goal.field("fence") == "f1"
        # t1 retried (its grant had to wait): the same delivery goes on under a new fence.
        assert goal.claim("t1", 1, "f4") == "ok"
        assert goal.requeue("t3") == 0  # the lease holds: nothing to queue again
        assert Lease(goal.client, goal.key, goal.lease, "f1", 60).renew() is False  # fenced out
        assert Lease(goal.client, goal.key, goal.lease, "f4", 60).renew() is True
        goal.client.delete(goal.lease)  # t1's worker died: its lease lapses
        assert goal.requeue("t3") == 1
        assert goal.requeue("t4") == 0  # queued once, not at every look of the driver
        assert goal.field("state") == "queued"
        # The dead worker's retry, restored later, is dropped: t3 is the goal's message now.
        assert goal.claim("t1", 2, "f5") == "leased"
        assert goal.claim("t3", 0, "f6") == "ok"
        assert (goal.field("owner"), goal.field("fence")) == ("t3", "f6")
    finally:
        goal.ledger.drop()


def test_a_dead_deliverys_spend_is_counted_once_when_its_goal_runs_again(tmp_path: Path) -> None:
    goal = _Goal()
    ledger = goal.ledger
    try:
        goal.died_holding(12_345)
        worker = goal.worker(tmp_path)
        payload = goal.payload()
        assert anyio.run(work_on_goal, payload, worker, Delivery("t2")) == "ok"
        state = goal.client.hgetall(goal.key)
        assert state["state"] == "succeeded" and state["runs"] == "2"
        # The dead delivery's call counts at what it held, once; the goal's spend is both
        # deliveries', and the batch's root holds exactly that.
        assert int(state["prior_pico"]) == 12_345
        root = anyio.run(ledger.balance, goal.root)
        assert (root.granted_pico, root.reserved_pico) == (0, 0)
        assert root.spent_pico == int(state["prior_pico"]) + int(state["spent_pico"])
        assert not goal.client.exists(goal.lease)  # a final goal needs no lease
        # The dead delivery's message, restored by the broker later, finds the goal final.
        assert anyio.run(work_on_goal, payload, worker, Delivery("t1")) == "duplicate"
        assert anyio.run(ledger.balance, goal.root).spent_pico == root.spent_pico
    finally:
        ledger.drop()


class _Killed(BaseException):
    """The worker process dies here (no handler of the worker's own runs)."""


class _DiesAfterOpening(RedisLedger):
    """A worker's ledger whose process dies as soon as Redis has opened a goal's account."""

    error: type[BaseException] = _Killed

    async def open(self, *args: Any, **kwargs: Any) -> RedisAccount:
        account = await super().open(*args, **kwargs)
        if args[1] is not None:  # a goal's account, under the batch's root
            raise self.error
        return account


class _LosesTheReply(_DiesAfterOpening):
    """A worker's ledger whose open of a goal's account runs in Redis, and whose reply is lost."""

    error = redis.TimeoutError


def test_an_account_whose_open_lost_its_reply_is_written_off_by_its_own_delivery(
    tmp_path: Path,
) -> None:
    goal = _Goal()
    ledger = goal.ledger
    try:
        worker = goal.worker(tmp_path, _LosesTheReply(ledger.client, ledger.namespace))
        assert anyio.run(work_on_goal, goal.payload(), worker, Delivery("t1")) == "ok"
        assert goal.field("state") == "failed" and "TimeoutError" in (goal.field("reason") or "")
        root = anyio.run(ledger.balance, goal.root)
        assert (root.granted_pico, root.spent_pico) == (0, 0)  # the grant came back whole
    finally:
        ledger.drop()


def test_an_account_opened_just_before_its_delivery_died_is_written_off_by_the_next(
    tmp_path: Path,
) -> None:
    goal = _Goal()
    ledger = goal.ledger
    try:
        payload = goal.payload()
        dying = goal.worker(tmp_path / "dying", _DiesAfterOpening(ledger.client, ledger.namespace))
        # Granted, then killed before it could mark the goal running.
        with pytest.raises(_Killed):
            anyio.run(work_on_goal, payload, dying, Delivery("t1"))
        granted = anyio.run(ledger.balance, goal.root).granted_pico
        assert granted == 10**12  # the batch's concurrency is 1: its whole budget is the cap
        assert goal.field("state") == "claimed" and goal.field("account")
        goal.client.delete(goal.lease)  # its lease lapses
        assert goal.requeue("t2") == 1
        worker = goal.worker(tmp_path / "next")
        assert anyio.run(work_on_goal, payload, worker, Delivery("t2")) == "ok"
        assert goal.field("state") == "succeeded"
        root = anyio.run(ledger.balance, goal.root)
        assert (root.granted_pico, root.reserved_pico) == (0, 0)
        assert root.spent_pico == int(goal.field("spent_pico") or 0) > 0
    finally:
        ledger.drop()


class _OpensLate(RedisLedger):
    """A worker's ledger whose open of a goal's account times out before Redis runs it: Redis
    runs it later (``late``), after the delivery gave up."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.late: list[Any] = []

    async def open(self, *args: Any, **kwargs: Any) -> RedisAccount:
        if args[1] is None:
            return await super().open(*args, **kwargs)
        self.late.append(partial(RedisLedger.open, self, *args, **kwargs))
        raise redis.TimeoutError("Timeout reading from socket")


def test_an_open_redis_runs_after_its_delivery_failed_is_refused(tmp_path: Path) -> None:
    goal = _Goal()
    ledger = goal.ledger
    try:
        late = _OpensLate(ledger.client, ledger.namespace)
        worker = goal.worker(tmp_path, late)
        assert anyio.run(work_on_goal, goal.payload(), worker, Delivery("t1")) == "ok"
        assert goal.field("state") == "failed"
        with pytest.raises(GuardFailed):
            anyio.run(late.late[0])
        assert anyio.run(ledger.balance, goal.root).granted_pico == 0
    finally:
        ledger.drop()


class _ResetOnce(RedisLedger):
    """A worker's ledger whose first write-off is lost before Redis runs it."""

    reset = False

    async def write_off(self, account: Account) -> Balance:
        if not self.reset:
            self.reset = True
            raise redis.ConnectionError("Connection reset by peer")
        return await super().write_off(account)


def test_a_delivery_that_fails_writing_off_a_dead_ones_account_writes_it_off_after_all(
    tmp_path: Path,
) -> None:
    goal = _Goal()
    ledger = goal.ledger
    try:
        goal.died_holding(12_345)
        worker = goal.worker(tmp_path, _ResetOnce(ledger.client, ledger.namespace))
        assert anyio.run(work_on_goal, goal.payload(), worker, Delivery("t2")) == "ok"
        assert goal.field("state") == "failed"
        assert int(goal.field("prior_pico") or 0) == 12_345  # the dead one's call, once
        root = anyio.run(ledger.balance, goal.root)
        assert (root.granted_pico, root.reserved_pico, root.spent_pico) == (0, 0, 12_345)
    finally:
        ledger.drop()


def test_a_guarded_open_opens_only_while_its_hash_holds_the_value_and_notes_the_id() -> None:
    goal = _Goal()
    ledger = goal.ledger
    try:
        assert goal.claim("t1", 0, "f1") == "ok"
        guard = Guard(goal.key, "fence", "f1", "account")
        account = anyio.run(partial(ledger.open, "g", goal.root, Fixed(None, 10), guard=guard))
        assert goal.field("account") == account.id
        goal.client.hset(goal.key, "fence", "f2")  # another delivery holds the goal now
        with pytest.raises(GuardFailed, match="no longer holds 'f1'"):
            anyio.run(partial(ledger.open, "g", goal.root, Fixed(None, 20), guard=guard))
        assert goal.field("account") == account.id
        assert anyio.run(ledger.balance, goal.root).granted_pico == 10  # nothing else opened
    finally:
        ledger.drop()


def test_a_lease_is_a_number_of_seconds_from_the_config_or_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("HIERPLAN_BATCH_LEASE_S", raising=False)
    assert lease_seconds() == 30.0
    assert lease_seconds(5) == 5.0
    monkeypatch.setenv("HIERPLAN_BATCH_LEASE_S", "12.5")
    assert lease_seconds() == 12.5
    assert lease_seconds(4) == 4.0  # the config's own wins
    for bad in ("soon", "0.2", "nan", "inf"):
        monkeypatch.setenv("HIERPLAN_BATCH_LEASE_S", bad)
        with pytest.raises(UserInputError, match="HIERPLAN_BATCH_LEASE_S must be a number"):
            lease_seconds()
    with pytest.raises(UserInputError, match="the lease must be"):
        lease_seconds(0)


def _batch(tmp_path: Path, *extra: str) -> tuple[int, str]:
    goals = tmp_path / "goals.jsonl"
    goals.write_text('{"goal": "Say hello", "id": "g"}\n')
    args = ["batch", str(goals), "--out", str(tmp_path / "out"), *extra]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    return result.exit_code, " ".join(result.output.split())


CELERY = ("--backend", "celery", "--broker", "redis://127.0.0.1:1/0")


@pytest.mark.parametrize("given", ["0.5", "0", "-3", "nan", "inf"])
def test_a_lease_option_below_a_second_or_not_finite_is_refused_before_anything(
    tmp_path: Path, given: str
) -> None:
    code, out = _batch(tmp_path, *CELERY, "--lease", given)
    assert code == 2, out
    assert f"--lease must be a number of seconds of at least 1, not {float(given)!r}" in out
    assert "Traceback" not in out and not (tmp_path / "out").exists()


def test_a_lease_option_applies_to_celery_only(tmp_path: Path) -> None:
    code, out = _batch(tmp_path, "--lease", "10")
    assert code == 2 and "--lease applies to --backend celery only" in out
    assert not (tmp_path / "out").exists()


def test_the_lease_option_is_the_batchs_lease_over_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HIERPLAN_BATCH_LEASE_S", "12.5")
    prepared: list[BatchConfig] = []

    def stop_at_prepare(config: BatchConfig, pricing: object = None) -> object:
        prepared.append(config)
        raise UserInputError("stopped before the batch starts")

    # Redis is not needed to see what the driver would send its workers.
    monkeypatch.setattr(cli_batch, "check_reachable", lambda url, shown: None)
    monkeypatch.setattr(cli_batch, "prepare", stop_at_prepare)
    code, out = _batch(tmp_path, *CELERY, "--lease", "7.5")
    assert code == 2 and "stopped before the batch starts" in out
    assert lease_seconds(prepared[0].lease_s) == 7.5
    code, out = _batch(tmp_path, *CELERY)
    assert lease_seconds(prepared[1].lease_s) == 12.5  # no --lease: the environment's
