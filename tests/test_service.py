"""The example service's HTTP API, through a real HTTP client over loopback."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx2
import pytest
from capitals import CapitalsScenario
from eventcheck import check_events
from liveservice import APP, example_app, free_port, parse_sse, serve

from hierplan.core.events import RunFinished, parse_event

SCENARIOS = {"capitals": CapitalsScenario(), "slow-capitals": CapitalsScenario(delay_s=30)}
FAST = {"scenario": "capitals", "sim_profile": "ideal", "sim_latency_scale": 0}


async def _events(client: httpx2.AsyncClient, run_id: str, **headers: str) -> list[dict[str, str]]:
    async with client.stream("GET", f"/runs/{run_id}/events", headers=headers) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line async for line in response.aiter_lines()]
    return parse_sse(lines)


@pytest.mark.anyio
async def test_the_service_streams_a_runs_events_as_sse(tmp_path: Path) -> None:
    app = example_app(tmp_path, SCENARIOS)
    async with serve(app) as base, httpx2.AsyncClient(base_url=base, timeout=30) as client:
        created = await client.post("/runs", json=FAST)
        assert created.status_code == 201, created.text
        run_id = created.json()["run_id"]
        assert created.json()["events"] == f"/runs/{run_id}/events"
        frames = await _events(client, run_id)
        assert frames[-1] == {"event": "end", "data": "{}"}
        events = [parse_event(f["data"]) for f in frames[:-1]]
        assert [f["event"] for f in frames[:-1]] == [e.type for e in events]
        assert [int(f["id"]) for f in frames[:-1]] == list(range(1, len(events) + 1))
        result = await app.state.runs.handles[run_id].result()
        check_events(events, result)
        status = (await client.get(f"/runs/{run_id}")).json()
        assert status["status"] == "succeeded"
        assert status["events"] == len(events)
        assert isinstance(events[-1], RunFinished)
        assert status["result"]["totals"]["cost_usd"] == pytest.approx(events[-1].cost_usd)
        # a client that reconnects with Last-Event-ID gets what it missed, and nothing twice
        again = await _events(client, run_id, **{"Last-Event-ID": "5"})
        assert again[:-1] == frames[5:-1]
    assert (tmp_path / "runs" / run_id / "facts.txt").exists()  # the run's own directory


@pytest.mark.anyio
async def test_bad_requests_get_a_clear_reason(tmp_path: Path) -> None:
    async with (
        serve(example_app(tmp_path, SCENARIOS)) as base,
        httpx2.AsyncClient(base_url=base) as client,
    ):

        async def error(body: Any, status: int = 400, **kw: Any) -> str:
            reply = await client.post("/runs", **({"json": body} if body is not None else kw))
            assert reply.status_code == status, reply.text
            message: str = reply.json()["error"]
            return message

        assert "colour: Extra inputs are not permitted" in await error({"colour": "red"})
        assert "unknown scenario 'nope'" in await error({"scenario": "nope"})
        assert "is free text" in await error({"scenario": None, "goal": "write a poem"})
        assert "unknown strategy 'fast'" in await error({**FAST, "strategy": "fast"})
        assert "sim_latency_scale" in await error({**FAST, "sim_latency_scale": -1})
        assert "must be a JSON object" in await error(None, content=b"{oops")
        for path in ("/runs/nope", "/runs/nope/events"):
            missing = await client.get(path)
            assert missing.status_code == 404 and missing.json() == {"error": "no such run"}
        assert (await client.post("/runs/nope/cancel")).status_code == 404


@pytest.mark.anyio
async def test_a_goal_alone_is_not_taken_for_a_goal_on_the_default_scenario(
    tmp_path: Path,
) -> None:
    async with (
        serve(example_app(tmp_path, SCENARIOS)) as base,
        httpx2.AsyncClient(base_url=base) as client,
    ):
        reply = await client.post("/runs", json={"goal": "write a poem"})
        assert reply.status_code == 400, reply.text
        assert "is free text" in reply.json()["error"]


@pytest.mark.anyio
async def test_cancel_over_http_and_runs_outlive_their_watchers(tmp_path: Path) -> None:
    app = example_app(tmp_path, SCENARIOS)
    async with serve(app) as base, httpx2.AsyncClient(base_url=base, timeout=30) as client:
        slow = (await client.post("/runs", json={**FAST, "scenario": "slow-capitals"})).json()
        fast = (await client.post("/runs", json=FAST)).json()
        # a watcher of the fast run leaves after two events: the run goes on without it
        async with client.stream("GET", fast["events"]) as response:
            seen = 0
            async for line in response.aiter_lines():
                seen += line.startswith("event: ")
                if seen == 2:
                    break
        await app.state.runs.handles[fast["run_id"]].result()
        assert (await client.get(f"/runs/{fast['run_id']}")).json()["status"] == "succeeded"
        reply = await client.post(f"/runs/{slow['run_id']}/cancel")
        assert reply.json() == {"run_id": slow["run_id"], "cancelled": True}
        frames = await _events(client, slow["run_id"])
        finished = parse_event(frames[-2]["data"])
        assert finished.type == "run_finished" and finished.status == "cancelled"  # type: ignore[attr-defined]
        status = (await client.get(f"/runs/{slow['run_id']}")).json()
        assert status["status"] == "cancelled"
        assert status["result"]["tree"]["status"] == "cancelled"


@pytest.mark.anyio
async def test_quiet_streams_get_keepalive_comments(tmp_path: Path) -> None:
    app = example_app(tmp_path, SCENARIOS, keepalive_s=0.05)
    async with serve(app) as base, httpx2.AsyncClient(base_url=base, timeout=30) as client:
        slow = (await client.post("/runs", json={**FAST, "scenario": "slow-capitals"})).json()
        lines: list[str] = []
        async with client.stream("GET", slow["events"]) as response:
            async for line in response.aiter_lines():
                lines.append(line)
                if lines.count(": keepalive") == 3:
                    break
        await client.post(f"/runs/{slow['run_id']}/cancel")
    events = [f["event"] for f in parse_sse(lines)]
    assert events[0] == "run_started" and "node_started" in events


@pytest.mark.anyio
async def test_the_service_keeps_the_work_directories_of_its_newest_runs_only(
    tmp_path: Path,
) -> None:
    """A data_migration run leaves 26 MB in its directory: the service keeps those of its
    newest finished runs (5 by default), so its work directory does not grow with every run."""
    for keep, runs in ((None, 7), (1, 3)):
        where = tmp_path / f"keep-{keep}"
        app = example_app(where, SCENARIOS, **({} if keep is None else {"keep_workdirs": keep}))
        started: list[str] = []
        async with serve(app) as base, httpx2.AsyncClient(base_url=base, timeout=30) as client:
            for _ in range(runs):
                run_id = (await client.post("/runs", json=FAST)).json()["run_id"]
                await _events(client, run_id)  # to its end
                started.append(run_id)
        # The service has stopped: every run has ended and been tidied up after.
        kept = sorted(p.name for p in (where / "runs").iterdir())
        assert kept == sorted(started[-(keep or 5) :])
        assert all((where / "runs" / run_id / "facts.txt").exists() for run_id in kept)


class _Watcher(threading.Thread):
    """A client that streams a run's events from the service until the stream ends."""

    def __init__(self, base: str, run_id: str) -> None:
        super().__init__(daemon=True)
        self.base, self.run_id = base, run_id
        self.lines: list[str] = []
        self.running = threading.Event()

    def run(self) -> None:
        url = f"{self.base}/runs/{self.run_id}/events"
        try:
            with httpx2.Client(timeout=None) as client, client.stream("GET", url) as response:
                for line in response.iter_lines():
                    self.lines.append(line)
                    if line == "event: node_started":
                        self.running.set()
        except httpx2.TransportError:
            self.lines.append(": the connection broke")


def _start_service(tmp_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    """The example service as its own process, as `python examples/live_runs/app.py` starts
    it; its base URL once it answers."""
    port = free_port()
    log = (tmp_path / "service.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, str(APP), "--port", str(port), "--workdir", str(tmp_path / "runs")],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            httpx2.get(f"{base}/runs/none", timeout=5)
            return process, base
        except httpx2.TransportError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise AssertionError((tmp_path / "service.log").read_text()) from None
            time.sleep(0.1)


def test_sigterm_cancels_the_runs_and_ends_their_streams(tmp_path: Path) -> None:
    """A client streaming a run does not keep the service up: on SIGTERM every run is
    cancelled, each stream ends with its run's ``cancelled`` and ``end``, and the process
    exits (without waiting for the runs to finish, or the clients to leave)."""
    process, base = _start_service(tmp_path)
    try:
        # data_migration at the simulator's latency: each run goes on for a minute or more.
        run_ids = [httpx2.post(f"{base}/runs", json={}, timeout=30).json()["run_id"] for _ in "ab"]
        watchers = [_Watcher(base, run_id) for run_id in run_ids]
        for watcher in watchers:
            watcher.start()
        for watcher in watchers:
            assert watcher.running.wait(60), watcher.lines
        process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        for watcher in watchers:
            watcher.join(60)
        streams_ended = time.monotonic() - signalled
        process.wait(60)
        exited = time.monotonic() - signalled
        print(f"\nSIGTERM: streams ended after {streams_ended:.1f} s, exit after {exited:.1f} s")
        for watcher in watchers:
            frames = parse_sse(watcher.lines)
            assert frames[-1] == {"event": "end", "data": "{}"}, watcher.lines[-5:]
            finished = parse_event(frames[-2]["data"])
            assert finished.type == "run_finished"
            assert finished.status == "cancelled"  # type: ignore[attr-defined]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.anyio
async def test_a_stopping_service_cancels_its_runs_and_starts_no_more(tmp_path: Path) -> None:
    app = example_app(tmp_path, SCENARIOS)
    async with serve(app) as base, httpx2.AsyncClient(base_url=base, timeout=30) as client:
        slow = (await client.post("/runs", json={**FAST, "scenario": "slow-capitals"})).json()
        app.state.runs.stop()
        refused = await client.post("/runs", json=FAST)
        assert refused.status_code == 503
        assert refused.json() == {"error": "the service is stopping: it starts no new runs"}
        frames = await _events(client, slow["run_id"])
        assert parse_event(frames[-2]["data"]).status == "cancelled"  # type: ignore[attr-defined]
