"""Live runs: a small web service that starts hierplan runs and streams their events.

Install the web extra and start it, then open http://127.0.0.1:8000/ ::

    pip install 'hierplan[web]'
    python examples/live_runs/app.py --port 8000

The API:

- ``POST /runs`` with a JSON body (``scenario``, ``goal``, ``strategy``, ``seed``,
  ``sim_profile``, ``sim_latency_scale``, ``max_depth``, ``concurrency``; all optional, and
  without a goal the scenario is ``data_migration``) starts a run and answers
  ``201 {"run_id": ..., "events": "/runs/<id>/events"}``; bad input is a ``400 {"error": ...}``
  with the reason.
- ``GET /runs/<id>/events`` streams the run's events as server-sent events: ``id`` is the
  event's position, ``event`` its type, ``data`` its JSON. A client that reconnects with
  ``Last-Event-ID`` gets the events after that one (the run handle keeps them all), so a
  browser's ``EventSource`` never misses one. The stream ends with ``event: end``.
- ``GET /runs/<id>`` is the run's status, and its record once it has ended.
- ``POST /runs/<id>/cancel`` cancels it.
- ``GET /`` is a page that starts runs and shows the plan tree growing as the events arrive.

Runs belong to the service's task group (they go on when a browser leaves) and each works in
its own directory under ``--workdir``. The service forgets the oldest finished runs beyond
``max_runs``, and removes the directories of finished runs beyond the newest
``--keep-workdirs`` (a ``data_migration`` run leaves 26 MB in its own).

SIGTERM or Ctrl-C stops the service at once: every run is cancelled (it ends ``cancelled``,
with its record), each event stream ends with its run, and the process exits. Without that,
uvicorn would wait for every streaming client to leave before the runs were told to stop.
"""

from __future__ import annotations

import argparse
import json
import shutil
import threading
import uuid
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager, suppress
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
import uvicorn
from anyio.abc import TaskGroup, TaskStatus
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

import hierplan
from hierplan.scenarios import Scenario

PAGE = Path(__file__).with_name("page.html")


class RunRequest(BaseModel):
    """What a client may ask for when it starts a run."""

    model_config = ConfigDict(extra="forbid")

    scenario: str | None = None
    goal: str | None = None
    strategy: str = "hierarchical"
    seed: int = 0
    sim_profile: str = "typical"
    sim_latency_scale: float = Field(1.0, ge=0, le=10)
    max_depth: int | None = Field(None, ge=1, le=10)
    concurrency: int | None = Field(None, ge=1, le=64)


class Runs:
    """The service's runs: started in its task group, kept by id (the newest ``limit``), each
    in a directory of its own under ``workdir`` (those of the newest ``keep_workdirs`` finished
    runs are kept)."""

    def __init__(
        self, workdir: Path, scenarios: Mapping[str, Scenario], limit: int, keep_workdirs: int
    ) -> None:
        self.workdir = workdir
        self.scenarios = dict(scenarios)
        self.limit = limit
        self.keep_workdirs = keep_workdirs
        self.handles: OrderedDict[str, hierplan.RunHandle] = OrderedDict()
        self.group: TaskGroup | None = None
        self.stopping = False
        self._finished: deque[str] = deque()  # run ids whose directories are kept, oldest first
        self._token: anyio.lowlevel.EventLoopToken | None = None

    async def start(self, request: RunRequest) -> hierplan.RunHandle:
        """Start a run; bad input raises :class:`hierplan.UserInputError` here."""
        assert self.group is not None, "the service is not running"
        if self.stopping:
            raise Stopping("the service is stopping: it starts no new runs")
        # The demo's scenario only when no goal is given: a goal alone is the client's own
        # goal, not one to run on the scenario's tools.
        default = None if request.goal is not None else "data_migration"
        scenario = request.scenario or default
        settings = request.model_dump(include={"seed", "max_depth", "concurrency"})
        run_id = uuid.uuid4().hex[:12]
        spec = hierplan.RunSpec(
            goal=request.goal,
            scenario=None if scenario is None else self.scenarios.get(scenario, scenario),
            strategy=request.strategy,
            settings={k: v for k, v in settings.items() if v is not None},
            model=hierplan.Simulator(
                profile=request.sim_profile, latency_scale=request.sim_latency_scale
            ),
            run_id=run_id,
            workdir=self.workdir / run_id,
        )
        handle = hierplan.start(spec)
        started: hierplan.RunHandle = await self.group.start(self._own, handle)
        self.handles[run_id] = started
        finished = [rid for rid, h in self.handles.items() if h.done]
        for rid in finished[: max(0, len(self.handles) - self.limit)]:
            del self.handles[rid]  # forget the oldest finished runs, never a running one
        return started

    def stop(self) -> None:
        """Start no more runs and cancel every one running: each ends ``cancelled`` (with its
        record), and so its event streams end."""
        self.stopping = True
        for handle in list(self.handles.values()):
            handle.cancel()

    def stop_from_signal(self) -> None:
        """:meth:`stop`, from a signal handler: one runs between any two steps of the event
        loop's own code, so the runs are cancelled from the loop, through a thread that hands
        the call to it."""
        token = self._token
        if token is None:
            return  # not serving yet: nothing has started

        def hand_over() -> None:
            with suppress(RuntimeError):  # the loop has ended meanwhile: nothing is left to stop
                anyio.from_thread.run_sync(self.stop, token=token)

        threading.Thread(target=hand_over, name="stop-runs", daemon=True).start()

    @asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        """The service's life: its runs go in its task group, and stop when it stops."""
        async with anyio.create_task_group() as group:
            self.group = group
            self._token = anyio.lowlevel.current_token()  # where a signal's stop is handed
            yield
            self.stop()

    async def _own(
        self, handle: hierplan.RunHandle, *, task_status: TaskStatus[hierplan.RunHandle]
    ) -> None:
        async with handle:
            task_status.started(handle)
            with suppress(Exception):  # a run's error stays with its handle
                await handle.result()
        await self._tidy(handle.run_id)

    async def _tidy(self, run_id: str) -> None:
        """A run has ended: remove the directories of the finished runs beyond the newest
        ``keep_workdirs`` (the run's record stays with its handle)."""
        self._finished.append(run_id)
        while len(self._finished) > self.keep_workdirs:
            old = self.workdir / self._finished.popleft()
            await anyio.to_thread.run_sync(partial(shutil.rmtree, old, ignore_errors=True))


class Stopping(Exception):
    """A run asked for while the service stops."""


def create_app(
    workdir: Path = Path("runs/service"),
    *,
    scenarios: Mapping[str, Scenario] | None = None,
    max_runs: int = 100,
    keepalive_s: float = 15.0,
    keep_workdirs: int = 5,
) -> Starlette:
    """The service. ``scenarios`` adds scenarios by name to the built-in ones; event streams
    send a comment line after ``keepalive_s`` seconds without an event; the directories of the
    newest ``keep_workdirs`` finished runs are kept, older ones removed."""
    runs = Runs(workdir, scenarios or {}, max_runs, keep_workdirs)

    async def page(request: Request) -> Response:
        return HTMLResponse(PAGE.read_text(encoding="utf-8"))

    async def start_run(request: Request) -> Response:
        try:
            body = await request.json()
            wanted = RunRequest.model_validate(body)
            handle = await runs.start(wanted)
        except json.JSONDecodeError:
            return _error(400, "the body must be a JSON object")
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "body"
            return _error(400, f"{where}: {first['msg']}")
        except hierplan.HierplanError as exc:
            return _error(400, str(exc))
        except Stopping as exc:
            return _error(503, str(exc))
        return JSONResponse(
            {"run_id": handle.run_id, "events": f"/runs/{handle.run_id}/events"}, 201
        )

    def found(request: Request) -> hierplan.RunHandle | None:
        return runs.handles.get(request.path_params["run_id"])

    async def events(request: Request) -> Response:
        handle = found(request)
        if handle is None:
            return _error(404, "no such run")
        since = _last_event_id(request.headers.get("last-event-id"))
        return StreamingResponse(
            _sse(handle, since, keepalive_s),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    async def status(request: Request) -> Response:
        handle = found(request)
        if handle is None:
            return _error(404, "no such run")
        body: dict[str, Any] = {
            "run_id": handle.run_id,
            "status": handle.status,
            "events": handle.event_count,
        }
        if handle.done and handle.status != "error":
            body["result"] = (await handle.result()).to_dict()
        return JSONResponse(body)

    async def cancel(request: Request) -> Response:
        handle = found(request)
        if handle is None:
            return _error(404, "no such run")
        return JSONResponse({"run_id": handle.run_id, "cancelled": handle.cancel()})

    app = Starlette(
        routes=[
            Route("/", page),
            Route("/runs", start_run, methods=["POST"]),
            Route("/runs/{run_id}", status),
            Route("/runs/{run_id}/events", events),
            Route("/runs/{run_id}/cancel", cancel, methods=["POST"]),
        ],
        lifespan=runs.lifespan,
    )
    app.state.runs = runs
    return app


def _error(code: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, code)


def _last_event_id(value: str | None) -> int:
    try:
        return max(0, int(value)) if value else 0
    except ValueError:
        return 0


async def _sse(handle: hierplan.RunHandle, since: int, keepalive_s: float) -> AsyncIterator[str]:
    stream = handle.events(since)
    while True:
        event = None
        with anyio.move_on_after(keepalive_s):  # waiting for an event is safe to interrupt
            try:
                event = await stream.__anext__()
            except StopAsyncIteration:
                break
        if event is None:
            # a comment line keeps proxies from closing a stream that is quiet for a while
            yield ": keepalive\n\n"
            continue
        yield f"id: {stream.position}\nevent: {event.type}\ndata: {event.model_dump_json()}\n\n"
    yield "event: end\ndata: {}\n\n"


class StoppingServer(uvicorn.Server):
    """uvicorn, whose signal handler also stops the service's runs: uvicorn itself waits for
    open connections to close before it lets the app stop, and a run's event stream stays open
    until its run ends."""

    def __init__(self, config: uvicorn.Config, runs: Runs) -> None:
        super().__init__(config)
        self.runs = runs

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """Stop the runs, then the server, as uvicorn does (a second Ctrl-C forces it)."""
        super().handle_exit(sig, frame)
        self.runs.stop_from_signal()


GRACE_S = 10
"""Seconds uvicorn waits for responses to end once the runs are cancelled (a client that no
longer reads its stream does not keep the service up)."""


def main() -> None:
    """Serve on loopback (``--host``/``--port``), runs under ``--workdir``."""
    parser = argparse.ArgumentParser(description="Start hierplan runs and watch them live.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--workdir", type=Path, default=Path("runs/service"))
    parser.add_argument(
        "--keep-workdirs",
        type=int,
        default=5,
        help="keep the directories of this many finished runs (default 5)",
    )
    args = parser.parse_args()
    if args.keep_workdirs < 0:
        parser.error("--keep-workdirs must be 0 or more")
    app = create_app(args.workdir, keep_workdirs=args.keep_workdirs)
    config = uvicorn.Config(app, host=args.host, port=args.port, timeout_graceful_shutdown=GRACE_S)
    StoppingServer(config, app.state.runs).run()


if __name__ == "__main__":
    main()
