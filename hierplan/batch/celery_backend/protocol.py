"""What the driver and the workers of a Celery batch agree on: the Celery app, the task's name
and queue, the Redis keys of a goal, and the Lua scripts that change a goal's state."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hierplan.errors import UserInputError

if TYPE_CHECKING:
    from celery import Celery

TASK_NAME = "hierplan.batch.goal"
QUEUE = "hierplan"
CELERY_INSTALL_HINT = "pip install 'hierplan[celery]'"

# KEYS: the goal's hash, the batch's root account, the goal's lease. ARGV: fence, worker, task
# id, retries, lease in milliseconds. A delivery of a batch whose keys are gone (it finished and
# deleted them, or Redis lost them) writes nothing: the driver is done, or says the ledger was
# lost. While another delivery's lease holds, this one is dropped ('leased'): it is a copy of a
# message whose delivery still runs (the broker restored it after its visibility timeout, or a
# resumed driver sent the goal again). A retry of the task that holds the goal (more retries than
# its claim had) goes on as that delivery; so does the task the driver queued the goal for after
# its lease lapsed. Once the lease has lapsed, any delivery claims the goal: the one holding it is
# presumed dead, fenced out, and its account is written off by the new one.
CLAIM = r"""
local g = KEYS[1]
if redis.call('EXISTS', KEYS[2]) == 0 then return 'gone' end
local state = redis.call('HGET', g, 'state')
if state == 'succeeded' or state == 'failed' or state == 'skipped' then return 'final' end
local retries = tonumber(redis.call('HGET', g, 'owner_retries') or '-1')
local mine = redis.call('HGET', g, 'owner') == ARGV[3] and tonumber(ARGV[4]) > retries
if state == 'queued' then
  if not mine then return 'leased' end
elseif redis.call('EXISTS', KEYS[3]) == 1 and not mine then
  return 'leased'
end
local old = redis.call('HGET', g, 'account')
if old and old ~= '' then redis.call('SADD', g .. ':old', old) end
redis.call('HSET', g, 'fence', ARGV[1], 'account', '', 'state', 'claimed', 'worker', ARGV[2],
  'owner', ARGV[3], 'owner_retries', ARGV[4])
redis.call('HINCRBY', g, 'deliveries', 1)
redis.call('SET', KEYS[3], ARGV[1], 'PX', ARGV[5])
return 'ok'
"""

# KEYS: the goal's hash. ARGV: fence, the goal's account. The delivery that holds the fence
# starts running the goal: counted in 'runs', which the journal keeps as the goal's attempts.
START = r"""
local g = KEYS[1]
if redis.call('HGET', g, 'fence') ~= ARGV[1] then return 'superseded' end
redis.call('HSET', g, 'account', ARGV[2], 'state', 'running')
redis.call('HINCRBY', g, 'runs', 1)
return 'ok'
"""

# ARGV: account id, tokens, pico. Counts a written-off account's spend once.
COUNT_OLD = r"""
local g = KEYS[1]
if redis.call('SREM', g .. ':old', ARGV[1]) == 1 then
  redis.call('HINCRBY', g, 'prior_tokens', ARGV[2])
  redis.call('HINCRBY', g, 'prior_pico', ARGV[3])
end
return 'ok'
"""

# KEYS: the goal's hash, the batch's list of finished goals, the goal's lease. ARGV: fence, goal
# id, then field/value pairs to set if the fence still holds. A goal left in a final state is
# announced on the list, which wakes the driver, and needs its lease no more.
FENCED_SET = r"""
local g = KEYS[1]
if redis.call('HGET', g, 'fence') ~= ARGV[1] then return 'superseded' end
for i = 3, #ARGV, 2 do redis.call('HSET', g, ARGV[i], ARGV[i + 1]) end
local state = redis.call('HGET', g, 'state')
if state == 'succeeded' or state == 'failed' or state == 'skipped' then
  redis.call('RPUSH', KEYS[2], ARGV[2])
  redis.call('DEL', KEYS[3])
end
return 'ok'
"""

FINAL = ("succeeded", "failed", "skipped")
"""The states of a goal that no delivery changes any more."""


def require_celery() -> None:
    """Refuse, with the command that installs it, a Celery backend without Celery."""
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
    """The Celery app of hierplan's batches (no result backend: state is in Redis); a worker
    registers the goal task on it (see :mod:`hierplan.batch.celery_backend.worker`), the driver
    only sends the task by name."""
    require_celery()
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
    return app


def goal_key(namespace: str, goal_id: str) -> str:
    """The Redis hash of a goal's state."""
    return f"{{{namespace}}}:g:{goal_id}"


def done_key(namespace: str) -> str:
    """The Redis list where workers announce goals that finished."""
    return f"{{{namespace}}}:done"
