"""The example page in headless Chromium: the plan tree grows as the events arrive.

Marked ``e2e``: ``make e2e`` (and ``.ci/run``) installs playwright and runs them with Debian's
chromium; a missing prerequisite fails the test with what to install, it never skips.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from liveservice import example_app, serve

from hierplan.core.events import NodeStarted

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
TERMINAL = {"succeeded", "partial", "failed", "cancelled", "rejected", "budget_exhausted"}


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    if not CHROMIUM.exists():  # noqa: ASYNC240 - one stat, before anything runs
        pytest.fail("Chromium is missing: apt-get install -y chromium (.ci/run does)")
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        pytest.fail("playwright is missing: pip install -e '.[dev,e2e]' (make e2e does)")
    async with async_playwright() as playwright:
        chromium = await playwright.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
        try:
            yield chromium
        finally:
            await chromium.close()


async def _start(page: Any, base: str, latency: str) -> str:
    await page.goto(base + "/")
    await page.fill("input[name=sim_latency_scale]", latency)
    await page.fill("input[name=seed]", "1")
    await page.click("#start")
    await page.wait_for_selector("#run.active")
    return str(await page.inner_text("#run-id"))


async def test_the_page_shows_the_plan_tree_growing(browser: Any, tmp_path: Path) -> None:
    app = example_app(tmp_path)
    async with serve(app) as base:
        page = await browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        run_id = await _start(page, base, "0.05")
        # while the run goes: the root's plan is shown before its sub-planners run
        await page.wait_for_selector('li[data-path="1"] > .plan', timeout=30_000)
        await page.wait_for_selector('li[data-path^="1."][data-status="running"]', timeout=30_000)
        sizes = [await page.locator("li[data-path]").count()]
        await page.wait_for_selector("#run[data-finished]", timeout=120_000)
        sizes.append(await page.locator("li[data-path]").count())
        await page.screenshot(path=str(tmp_path / "live-runs.png"), full_page=True)
        handle = app.state.runs.handles[run_id]
        result = await handle.result()
        started = [e async for e in handle.events() if isinstance(e, NodeStarted)]
        assert await page.inner_text("#status") == result.status == "succeeded"
        # The page shows the nodes that started; a step that a revised plan dropped before it
        # started is in the record (cancelled) but was never shown running.
        ran = {n.path: n.status for n in result.nodes() if n.started_at is not None}
        dropped = [n for n in result.nodes() if n.started_at is None]
        assert all(n.status == "cancelled" and n.step_id for n in dropped), dropped
        assert sizes[0] < sizes[1] == len(started) == len(ran)
        paths = await page.eval_on_selector_all(
            "li[data-path]", "els => els.map(e => [e.dataset.path, e.dataset.status])"
        )
        shown = dict(paths)
        assert shown == ran
        assert max(p.count(".") for p in shown) == 2  # three levels
        assert await page.locator("li.planned").count() == 0  # every planned step ran
        cost = float(await page.inner_text("#cost"))
        assert cost == pytest.approx(result.totals()["cost_usd"], abs=1e-4)
        assert not errors


async def test_the_cancel_button_stops_the_run(browser: Any, tmp_path: Path) -> None:
    app = example_app(tmp_path)
    async with serve(app) as base:
        page = await browser.new_page()
        run_id = await _start(page, base, "1")
        await page.wait_for_selector('li[data-path="1"][data-status="running"]', timeout=30_000)
        await page.click("#cancel")
        await page.wait_for_selector('#run[data-finished="cancelled"]', timeout=30_000)
        result = await app.state.runs.handles[run_id].result()
        assert result.status == "cancelled"
        statuses = await page.eval_on_selector_all(
            "li[data-path]", "els => els.map(e => e.dataset.status)"
        )
        assert statuses and set(statuses) <= TERMINAL
