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
``max_runs``.
"""

from __future__ import annotations

import argparse
import json
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import anyio
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
    """The service's runs: started in its task group, kept by id (the newest ``limit``)."""

    def __init__(self, workdir: Path, scenarios: Mapping[str, Scenario], limit: int) -> None:
        self.workdir = workdir
        self.scenarios = dict(scenarios)
        self.limit = limit
        self.handles: OrderedDict[str, hierplan.RunHandle] = OrderedDict()
        self.group: TaskGroup | None = None

    async def start(self, request: RunRequest) -> hierplan.RunHandle:
        """Start a run; bad input raises :class:`hierplan.UserInputError` here."""
        assert self.group is not None, "the service is not running"
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

    async def _own(
        self, handle: hierplan.RunHandle, *, task_status: TaskStatus[hierplan.RunHandle]
    ) -> None:
        async with handle:
            task_status.started(handle)
            with suppress(Exception):  # a run's error stays with its handle
                await handle.result()


def create_app(
    workdir: Path = Path("runs/service"),
    *,
    scenarios: Mapping[str, Scenario] | None = None,
    max_runs: int = 100,
    keepalive_s: float = 15.0,
) -> Starlette:
    """The service. ``scenarios`` adds scenarios by name to the built-in ones; event streams
    send a comment line after ``keepalive_s`` seconds without an event."""
    runs = Runs(workdir, scenarios or {}, max_runs)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with anyio.create_task_group() as group:
            runs.group = group
            yield
            for handle in runs.handles.values():
                handle.cancel()  # the service stops: so do its runs

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
        lifespan=lifespan,
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


def main() -> None:
    """Serve on loopback (``--host``/``--port``), runs under ``--workdir``."""
    import uvicorn

    parser = argparse.ArgumentParser(description="Start hierplan runs and watch them live.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--workdir", type=Path, default=Path("runs/service"))
    args = parser.parse_args()
    uvicorn.run(create_app(args.workdir), host=args.host, port=args.port)


if __name__ == "__main__":
    main()
