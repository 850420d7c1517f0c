"""The trace of a run paused for a review and of its resume: the resumed run's workflow span
links to the paused run's, through the span ids its checkpoint keeps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from tracing_support import ScriptedRun, Telemetry

import hierplan
from hierplan import Approve, CallbackApprover, Defer, GateContext, Plan
from hierplan.durable.checkpoint import CHECKPOINT_FILE
from hierplan.tracing.otel import Tracing

pytestmark = pytest.mark.anyio


async def _defer_the_report(plan: Plan, ctx: GateContext) -> Approve | Defer:
    return Defer(by="test") if ctx.step is not None and ctx.step.id == "report" else Approve()


async def _pause(scripted: ScriptedRun, where: Path, tracing: Tracing | None) -> None:
    result = await hierplan.run(
        instruments=[] if tracing is None else [tracing],
        approver=CallbackApprover(_defer_the_report),
        checkpoint_dir=where,
        **scripted.run_options(),
    )
    assert result.status == "paused", result.error


async def _resume(scripted: ScriptedRun, where: Path, telemetry: Telemetry) -> ReadableSpan:
    """Resume the paused run traced by ``telemetry``; its workflow span."""
    result = await hierplan.resume(
        where,
        Approve(by="test"),
        model=scripted.model,
        tools=scripted.tools(),
        instruments=[telemetry.tracing()],
    )
    assert result.status == "succeeded", result.error
    (workflow,) = [s for s in telemetry.finished() if s.parent is None]
    return workflow


def _saved(where: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads((where / CHECKPOINT_FILE).read_text())
    return data


async def test_a_resumed_run_s_workflow_span_links_to_the_paused_run_s(tmp_path: Path) -> None:
    scripted = ScriptedRun()
    paused_side, resumed_side = Telemetry(), Telemetry()
    await _pause(scripted, tmp_path, paused_side.tracing())
    (paused,) = [s for s in paused_side.finished() if s.parent is None]
    assert paused.context is not None and not paused.links
    assert (paused.attributes or {})["hierplan.run.status"] == "paused"
    assert _saved(tmp_path)["workflow_span"] == {
        "trace_id": f"{paused.context.trace_id:032x}",
        "span_id": f"{paused.context.span_id:016x}",
    }

    resumed = await _resume(scripted, tmp_path, resumed_side)
    (link,) = resumed.links
    linked = link.context
    # The ids name the span; the checkpoint keeps no more (the link is to a span that was
    # exported, so sampled, and started elsewhere: remote).
    assert (linked.trace_id, linked.span_id) == (paused.context.trace_id, paused.context.span_id)
    assert linked.trace_flags.sampled and linked.is_remote
    assert dict(link.attributes or {}) == {"hierplan.link.reason": "resumed from pause"}
    assert resumed.context is not None and resumed.context.trace_id != paused.context.trace_id
    assert (resumed.attributes or {})["hierplan.run.status"] == "succeeded"
    # Only the workflow span links: the agent spans below it are the resumed run's own.
    assert all(not s.links for s in resumed_side.finished() if s.parent is not None)


async def test_a_checkpoint_without_the_paused_run_s_span_resumes_without_a_link(
    tmp_path: Path,
) -> None:
    scripted = ScriptedRun()
    await _pause(scripted, tmp_path, Telemetry().tracing())
    path = tmp_path / CHECKPOINT_FILE
    data = _saved(tmp_path)
    # As a hierplan that did not keep the span wrote it.
    assert data.pop("workflow_span")
    path.write_text(json.dumps(data, indent=1))

    resumed = await _resume(scripted, tmp_path, Telemetry())
    assert not resumed.links
    assert (resumed.attributes or {})["hierplan.run.status"] == "succeeded"


@pytest.mark.parametrize("traced", ["off", "sampled out"])
async def test_a_paused_run_whose_span_is_not_exported_keeps_no_span_ids(
    tmp_path: Path, traced: str
) -> None:
    scripted = ScriptedRun()
    tracing = None if traced == "off" else Tracing(tracer_provider=TracerProvider(ALWAYS_OFF))
    await _pause(scripted, tmp_path, tracing)
    assert "workflow_span" not in _saved(tmp_path)
    resumed = await _resume(scripted, tmp_path, Telemetry())
    assert not resumed.links
