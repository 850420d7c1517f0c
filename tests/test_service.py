"""The example service's HTTP API, through a real HTTP client over loopback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx2
import pytest
from capitals import CapitalsScenario
from eventcheck import check_events
from liveservice import example_app, parse_sse, serve

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
