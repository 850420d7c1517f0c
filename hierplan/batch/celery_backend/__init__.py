"""The Celery backend: goals run on ``hierplan worker`` processes, the budget lives in Redis.

The driver (``hierplan batch --backend celery``) keeps up to ``--concurrency`` goals enqueued,
follows their state in Redis, and journals each finished goal in ``DIR``. Workers use the
threads pool with one anyio portal (an event loop in a thread) per process: each task thread
hands its goal to the portal, so the goals of a process share one loop.

Every delivery first **claims** the goal in Redis (a Lua script that fences out any earlier
delivery whose worker is presumed dead), takes a **lease** on it that its worker's heartbeat
renews (see :mod:`~hierplan.batch.celery_backend.lease`), **writes off** the account of an
earlier delivery that did not finish (the calls it held count as spent), and then is granted a
new account (see :mod:`hierplan.batch.budget`), named in the goal's hash in the same Redis step
that opens it, and only while the delivery's fence holds: a delivery that dies at any point
leaves no account the next one cannot find. A goal whose cap does not fit while others hold
grants is retried a moment later; one whose minimum cannot be covered at all is recorded as
skipped.

When a worker dies, the leases of its goals lapse (30 seconds by default) and the driver sends
those goals to the queue again; each delivery that starts a goal counts as one of its attempts
in the journal. Messages are also acknowledged late (after the goal ends), so one a worker took
but had not claimed yet when it died comes back after the broker's visibility timeout. A copy
of a message whose delivery still holds its lease is dropped; a delivery that was fenced out
finds its account closed: its calls are refused and its result is dropped, so a goal is never
finished twice, and what each delivery spent is counted once.

Redis keys of a batch share its namespace: the ledger's accounts, and one hash per goal
(``{ns}:g:<goal id>``) with its state, fence, account, spend and record, and its lease
(``{ns}:l:<goal id>``). When every goal is
journaled as final, the driver keeps the root account's figures in the journal and deletes every
key of the namespace (see :func:`forget_ledger` for why that is safe); a resume of a finished
batch has nothing left to run and needs none of them.
"""

from __future__ import annotations

from hierplan.batch.celery_backend.driver import forget_ledger, run_celery
from hierplan.batch.celery_backend.lease import DEFAULT_LEASE_S, LEASE_VARIABLE, lease_key
from hierplan.batch.celery_backend.protocol import (
    QUEUE,
    TASK_NAME,
    done_key,
    goal_key,
    make_app,
    transport_options,
)
from hierplan.batch.celery_backend.worker import (
    WORKER,
    Delivery,
    WorkerState,
    run_worker,
    work_on_goal,
)

__all__ = [
    "DEFAULT_LEASE_S",
    "LEASE_VARIABLE",
    "QUEUE",
    "TASK_NAME",
    "WORKER",
    "Delivery",
    "WorkerState",
    "done_key",
    "forget_ledger",
    "goal_key",
    "lease_key",
    "make_app",
    "run_celery",
    "run_worker",
    "transport_options",
    "work_on_goal",
]
