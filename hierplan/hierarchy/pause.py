"""Pausing a run at the gate, its checkpoint, and restoring a run from one.

Pause: when an approver answers :class:`~hierplan.hierarchy.gate.Defer`, the node keeps its plan as
``pending`` and the run starts no new step: steps that have not started wait, and the steps
already running finish (their results are kept). Planning that is due goes on to its gate, so
that every plan that can wait for a decision at that moment is saved at once (sub-goals that
became ready together are decided together); no tool runs for them. Once no step and no planning
round runs any more, the run stops with status ``paused``. With a checkpoint directory,
:func:`write_checkpoint` saves the run record, every finished step's result, and each pending plan
(also as YAML, for people to read and edit).

Resume: a :class:`Restore` rebuilds the run from a checkpoint. A node's approved plan is used again
without calling the planner, finished steps keep their results and do not run again, and a pending
plan gets the decision given to :func:`hierplan.resume` (or goes to the approver again).

Only leaf steps and planning rounds count as running work (:meth:`PauseControl.working`); a step
records its result before it stops counting. When the count reaches zero, the pause waits until
every task of the loop is blocked (tasks just scheduled get to start their work or reach a wait),
checks the count again, and only then stops the run.
"""

from __future__ import annotations

import json
import re
import shlex
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import anyio
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from hierplan.core.results import StepResult
from hierplan.core.views import Resumed, SpanIds
from hierplan.errors import UserInputError, first_problem
from hierplan.files import make_directory, write_atomic
from hierplan.hierarchy.gate import Decision, Edit, GateContext
from hierplan.models.provider import one_line
from hierplan.plans.plan import Plan, plan_to_yaml
from hierplan.records import NodeRecord, PlanVersion, RunResult
from hierplan.units import usd_to_pico

if TYPE_CHECKING:
    from hierplan.hierarchy.context import NodeContext, RunContext

CHECKPOINT_FILE = "checkpoint.json"
RESUMING_FILE = "checkpoint.resuming.json"
PENDING_DIR = "pending"
CHECKPOINT_FORMAT = 1
ENDED = frozenset({"failed", "cancelled", "rejected", "budget_exhausted", "partial"})
# How long to wait for every task to block before a pause checks its count anyway (a host
# application may have tasks that never block).
SETTLE_TIMEOUT_S = 5.0


def rejection_feedback(reason: str) -> str:
    """What the planner is told about a rejected plan."""
    return f"The reviewer rejected your last plan: {reason}"


def invalid_feedback(problems: list[str]) -> str:
    """What the planner is told about an invalid plan."""
    return "Your last plan was invalid: " + "; ".join(problems)


@dataclass(slots=True)
class PlanState:
    """Where a restored node's planning stands.

    ``approved``: the plan to run (no planning needed). ``pending``: a version waiting for a
    decision. Otherwise the node plans again, with ``feedback`` about its last proposal.
    ``previous`` is the last approved plan before the open proposal (for a replan's diff).
    """

    approved: Plan | None = None
    pending: PlanVersion | None = None
    previous: Plan | None = None
    feedback: str | None = None
    invalid: int = 0
    rejections: int = 0


@dataclass(slots=True)
class Restore:
    """A paused run to continue: its record, finished step results and the decisions made.
    ``workflow_span``: the paused run's workflow span, when it was traced."""

    record: RunResult
    results: dict[str, StepResult]
    decisions: dict[str, Decision] = field(default_factory=dict)
    invocation: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    workflow_span: SpanIds | None = None

    @property
    def resumed(self) -> Resumed:
        """What the resumed run carries over: what the paused part spent (its budget's exact
        figures, ``RunResult.budget["spent"]``) and its workflow span."""
        spent = (self.record.budget or {}).get("spent") or {}
        pico, usd = spent.get("pico"), spent.get("usd")
        return Resumed(
            int(spent.get("tokens") or 0),
            int(pico) if pico is not None else usd_to_pico(usd or 0.0),
            self.workflow_span,
        )

    def decision_for(self, path: str) -> Decision | None:
        """The decision made outside the run for the pending plan of node ``path``."""
        return self.decisions.get(path)

    def pending_paths(self) -> list[str]:
        """Nodes whose plan waits for a decision."""
        return [node.path for node, _ in pending_versions(self.record.tree)]


class PauseControl:
    """One run's pause state and, when resuming, what to restore. See the module docstring."""

    def __init__(self, restore: Restore | None = None) -> None:
        self.pausing = False
        self.busy = 0
        self.scope: anyio.CancelScope | None = None
        self.restore = restore
        self.results: dict[str, StepResult] = dict(restore.results) if restore else {}
        self._taken: set[tuple[str, str]] = set()
        self._idle: anyio.Event | None = None  # made inside the event loop, when first needed
        self._draining = False

    @property
    def paused(self) -> bool:
        """Whether the run stopped to wait for a decision."""
        return self.pausing and self.scope is not None and self.scope.cancel_called

    @contextmanager
    def working(self) -> Iterator[None]:
        """Count a leaf step or a planning round as running work (a plain, not async, scope)."""
        self.busy += 1
        try:
            yield
        finally:
            self.busy -= 1
            self._stop_if_idle()

    def work_started(self) -> None:
        """:meth:`working` without the context manager: call :meth:`work_ended` after."""
        self.busy += 1

    def work_ended(self) -> None:
        """The end of work counted by :meth:`work_started`."""
        self.busy -= 1
        self._stop_if_idle()

    async def wait_if_paused(self) -> None:
        """Called before a step starts: while the run pauses, wait to be cancelled."""
        if self.pausing:
            await anyio.sleep_forever()

    async def hold(self) -> None:
        """A plan waits for an outside decision: pause the run and wait to be cancelled.

        The first plan held also watches the run and stops it once nothing runs any more.
        """
        if self.scope is None:
            raise RuntimeError("a plan was deferred outside a run: use hierplan.run()")
        self.pausing = True
        if self._idle is None:
            self._idle = anyio.Event()
        self._stop_if_idle()
        if not self._draining:
            self._draining = True
            await self._drain(self.scope)
        await anyio.sleep_forever()

    async def _drain(self, scope: anyio.CancelScope) -> None:
        while True:
            assert self._idle is not None
            await self._idle.wait()
            with anyio.move_on_after(SETTLE_TIMEOUT_S):
                await anyio.wait_all_tasks_blocked()
            if self.busy == 0:
                scope.cancel()
                return
            self._idle = anyio.Event()

    def restore_decision(self, path: str) -> Decision | None:
        """The outside decision for node ``path``'s pending plan, if one was given."""
        return None if self.restore is None else self.restore.decision_for(path)

    def finished(self, path: str, result: StepResult) -> None:
        """Keep a finished node's result for the checkpoint."""
        self.results[path] = result

    def _stop_if_idle(self) -> None:
        if self.pausing and self.busy == 0 and self._idle is not None:
            self._idle.set()

    def _take(self, kind: str, node: NodeContext) -> bool:
        """True the first time ``kind`` is restored for ``node`` in a resumed run."""
        key = (kind, node.path)
        if self.restore is None or key in self._taken:
            return False
        self._taken.add(key)
        return True

    def plan_state(self, node: NodeContext) -> PlanState | None:
        """Where a restored node's planning stands, or ``None`` (plan as usual)."""
        if not self._take("plan", node) or not node.record.plan_versions:
            return None
        versions = node.record.plan_versions
        open_version = next(
            (v for v in reversed(versions) if not (v.reason == "edit" and v.decision == "invalid")),
            versions[-1],
        )
        if open_version.decision == "approved":
            return PlanState(approved=open_version.plan)
        state = PlanState(
            previous=next((v.plan for v in reversed(versions) if v.decision == "approved"), None)
        )
        for v in reversed(versions):
            if v.decision == "approved":
                break
            if v.decision == "rejected":
                state.rejections += 1
            elif v.decision == "invalid" and v.reason != "edit":
                state.invalid += 1
        if open_version.decision in (None, "pending"):
            state.pending = open_version
        elif open_version.decision == "rejected":
            state.feedback = rejection_feedback(open_version.note)
        else:
            state.feedback = invalid_feedback(open_version.problems)
        return state

    def done_for(self, node: NodeContext, plan: Plan) -> dict[str, StepResult]:
        """Results of ``plan``'s steps that finished before the pause."""
        matched = _match_children(node.record, plan)
        return {
            sid: self.results[rec.path]
            for sid, rec in matched.items()
            if rec.status == "succeeded" and rec.path in self.results
        }

    def restore_children(
        self, node: NodeContext, plan: Plan
    ) -> tuple[dict[str, NodeContext], dict[str, StepResult]] | None:
        """The child nodes of ``plan`` to go on with, and the results of the finished ones.

        A finished step keeps its result. A sub-planner that had started is entered again (it
        restores its own plan). A step that failed or was cancelled gets a new child node.
        """
        if not self._take("children", node):
            return None
        matched = _match_children(node.record, plan)
        done = self.done_for(node, plan)
        children: dict[str, NodeContext] = {}
        for step_id, rec in matched.items():
            if step_id not in done:
                if rec.status in ENDED and rec.kind == "executor":
                    continue
                if rec.status in ENDED and not rec.plan_versions:
                    continue
                rec.status = "pending"
                rec.error = None
            step = plan.step(step_id)
            allowed = node.allowed_tools
            if step.tools is not None:
                allowed = allowed & frozenset(step.tools)
            children[step_id] = type(node)(
                node.run, rec, parent=node, step=step, allowed_tools=allowed
            )
        kept = {rec.path for rec in matched.values()}
        for rec in node.record.children:
            if rec.status == "paused" and rec.path not in kept:
                rec.status = "cancelled"
                rec.error = "not resumed: the plan no longer has this step"
        return children, done

    def as_needed_start(
        self, node: NodeContext
    ) -> tuple[Literal["attempt", "plan", "done"], StepResult | None]:
        """How a restored as-needed node goes on: attempt directly, decompose, or it is done."""
        if not self._take("as-needed", node):
            return "attempt", None
        if node.record.plan_versions:
            return "plan", None
        first = node.record.children[0] if node.record.children else None
        if first is None or first.kind != "executor":
            return "attempt", None
        if first.status == "succeeded" and first.path in self.results:
            return "done", self.results[first.path]
        if first.status in ENDED:
            return "plan", None
        node.record.children.remove(first)
        return "attempt", None


def _match_children(record: NodeRecord, plan: Plan) -> dict[str, NodeRecord]:
    """For each step of ``plan``, the latest child record made for that very step."""
    steps = plan.step_map()
    out: dict[str, NodeRecord] = {}
    for rec in record.children:
        step = steps.get(rec.step_id or "")
        if step is not None and rec.goal == step.instruction and rec.tool == step.tool:
            out[step.id] = rec
    return out


def pending_versions(tree: NodeRecord) -> list[tuple[NodeRecord, PlanVersion]]:
    """Every node whose latest proposal waits for a decision, with that version."""
    out: list[tuple[NodeRecord, PlanVersion]] = []
    for node in tree.walk():
        proposals = [
            v for v in node.plan_versions if not (v.reason == "edit" and v.decision == "invalid")
        ]
        if proposals and proposals[-1].decision == "pending":
            out.append((node, proposals[-1]))
    return out


def check_decisions(run: RunContext, restore: Restore, *, flat: bool) -> None:
    """Check the outside decisions before a resumed run starts anything.

    Each must be for a pending plan; an edited plan must pass the gate's validators for its
    node. Raises :class:`UserInputError` naming what is wrong.
    """
    missing = sorted(set(restore.invocation.get("tools", [])) - run.toolbox.names())
    if missing:
        raise UserInputError(
            f"the paused run used tools that are not given now: {', '.join(missing)}; pass the "
            "same tools to resume"
        )
    pending = {
        node.path: (node, version) for node, version in pending_versions(restore.record.tree)
    }
    for path, decision in restore.decisions.items():
        if path not in pending:
            raise UserInputError(
                f"node {path} has no pending plan; pending: {', '.join(pending) or 'none'}"
            )
        if not isinstance(decision, Edit):
            continue
        node, version = pending[path]
        ctx = GateContext(
            path=path,
            goal=node.goal,
            depth=node.depth,
            max_depth=node.depth if flat else run.settings.max_depth,
            max_steps=run.settings.max_steps,
            allowed_tools=_allowed_tools(restore.record.tree, path, run.toolbox.names()),
            toolbox=run.toolbox,
            version=version.version + 1,
            reason="edit",
            previous=version.plan,
        )
        problems = run.gate.validate(decision.plan, ctx)
        if problems:
            raise UserInputError(
                f"the edited plan for node {path} is invalid: "
                + "; ".join(str(p) for p in problems)
                + ". Nothing was resumed: fix the plan and run hierplan resume again"
            )


def check_edit_goals(tree: NodeRecord, decisions: Mapping[str, Decision]) -> None:
    """Refuse an edited plan made for another goal than its pending node's.

    A plan file saved for another node (or another run) would otherwise be validated against
    this node's tools and run in its place. The goal may be the node's or the one of the plan
    saved in ``pending/<node>.yaml`` (the planner words its plan's goal itself), compared with
    whitespace made single spaces: the YAML of a pending plan folds long lines, and an editor
    may wrap them again. Raises :class:`UserInputError` before anything is written.
    """
    pending = {node.path: (node, version) for node, version in pending_versions(tree)}
    for path, decision in decisions.items():
        if not isinstance(decision, Edit) or path not in pending:
            continue
        node, version = pending[path]
        given = _goal_key(decision.plan.goal)
        if given in (_goal_key(node.goal), _goal_key(version.plan.goal)):
            continue
        raise UserInputError(
            f"the edited plan is for the goal {one_line(decision.plan.goal, 80)!r}, but node "
            f"{path} waits on a plan for {one_line(node.goal, 80)!r}: pass the plan saved for "
            f"that node ({PENDING_DIR}/{path}.yaml, edited), or set the plan's goal to the "
            "node's. Nothing was resumed"
        )


def _goal_key(goal: str) -> str:
    return " ".join(goal.split())


def _allowed_tools(tree: NodeRecord, path: str, names: frozenset[str]) -> frozenset[str]:
    """The tools node ``path`` may use: every tool, narrowed by each step's ``tools`` above it."""
    allowed = names
    parent = tree
    parts = path.split(".")
    for depth in range(2, len(parts) + 1):
        child = parent.find(".".join(parts[:depth]))
        for version in reversed(parent.plan_versions):
            step = version.plan.step_map().get(child.step_id or "")
            if step is not None and step.instruction == child.goal:
                if step.tools is not None:
                    allowed = allowed & frozenset(step.tools)
                break
        parent = child
    return allowed


class SavedResult(BaseModel):
    """A finished step's result as saved in a checkpoint."""

    model_config = ConfigDict(extra="forbid")

    output: Any = None
    text: str


class Checkpoint(BaseModel):
    """What ``checkpoint.json`` holds: enough to continue a paused run, and the paused run's
    workflow span when it was traced (``workflow_span``, absent otherwise and in checkpoints
    written before it was kept)."""

    model_config = ConfigDict(extra="forbid")

    format: int = CHECKPOINT_FORMAT
    run_id: str
    created_at: float
    pending: list[str]
    invocation: dict[str, Any]
    extra: dict[str, Any] = {}
    results: dict[str, SavedResult]
    record: dict[str, Any]
    workflow_span: SpanIds | None = None

    def restore(self, decisions: Mapping[str, Decision] | None = None) -> Restore:
        """A :class:`Restore` of this checkpoint with ``decisions`` by node path."""
        try:
            record = _RECORD.validate_python(self.record)
        except ValidationError as exc:
            raise UserInputError(
                f"the checkpoint's run record is damaged ({exc.error_count()} problem(s)); "
                "the run cannot be resumed"
            ) from None
        return Restore(
            record=record,
            results={k: StepResult(v.output, v.text) for k, v in self.results.items()},
            decisions=dict(decisions or {}),
            invocation=dict(self.invocation),
            extra=dict(self.extra),
            workflow_span=self.workflow_span,
        )


_RECORD: TypeAdapter[RunResult] = TypeAdapter(RunResult)


def _jsonable(value: Any) -> Any:
    """``value`` as plain JSON data (anything else becomes its text)."""
    return json.loads(json.dumps(value, default=str))


def write_checkpoint(
    run_dir: Path,
    result: RunResult,
    control: PauseControl,
    invocation: Mapping[str, Any],
    extra: Mapping[str, Any] | None = None,
    workflow_span: SpanIds | None = None,
) -> Path:
    """Save a paused run in ``run_dir``: ``checkpoint.json`` and ``pending/<node>.yaml``.
    ``workflow_span``: the run's workflow span, when it was traced."""
    make_directory(run_dir, "the checkpoint's directory")
    pending = pending_versions(result.tree)
    folder = run_dir / PENDING_DIR
    folder.mkdir(exist_ok=True)
    for old in _pending_files(folder):
        old.unlink()
    for node, version in pending:
        write_atomic(folder / f"{node.path}.yaml", _pending_yaml(run_dir, result, node, version))
    checkpoint = Checkpoint(
        run_id=result.run_id,
        created_at=time.time(),
        pending=[node.path for node, _ in pending],
        invocation=_jsonable(dict(invocation)),
        extra=_jsonable(dict(extra or {})),
        results={
            path: SavedResult(output=_jsonable(r.output), text=r.text)
            for path, r in control.results.items()
        },
        record=result.to_dict(),
        workflow_span=workflow_span,
    )
    path = run_dir / CHECKPOINT_FILE
    # Without a span the file has no such field: a hierplan that does not know it can resume
    # an untraced run's checkpoint as before.
    leave_out = None if workflow_span is not None else {"workflow_span"}
    write_atomic(path, checkpoint.model_dump_json(indent=1, exclude=leave_out))
    return path


def _pending_yaml(run_dir: Path, result: RunResult, node: NodeRecord, version: PlanVersion) -> str:
    one = f" --node {node.path} --version {version.version}"
    where = shlex.quote(str(run_dir))  # the commands are pasted into a shell as they are
    head = [
        f"Pending plan for node {node.path} (version {version.version}, {version.reason}) "
        f"of run {result.run_id}.",
        f"Goal: {' '.join(node.goal.split())[:200]}",
        *(["SIMULATED: proposed by the offline simulator."] if result.simulated else []),
        f"Approve: hierplan resume {where} --approve{one}",
        f'Reject:  hierplan resume {where} --reject "why"{one}',
        f"Edit:    change a copy of this file, then hierplan resume {where} --plan FILE{one}",
    ]
    return "".join(f"# {line}\n" for line in head) + plan_to_yaml(version.plan)


def _pending_files(folder: Path) -> list[Path]:
    """The pending plans a checkpoint wrote in ``folder`` (``<node path>.yaml``), and nothing
    else: a reviewer may keep an edited copy next to them, for ``resume --plan``."""
    return [path for path in folder.glob("*.yaml") if _NODE_PATH.fullmatch(path.stem)]


_NODE_PATH = re.compile(r"[0-9]+(?:\.[0-9]+)*")


def clear_checkpoint(run_dir: Path) -> None:
    """Forget a paused run in ``run_dir``: a new run there makes its checkpoint stale."""
    for name in (CHECKPOINT_FILE, RESUMING_FILE):
        (run_dir / name).unlink(missing_ok=True)
    folder = run_dir / PENDING_DIR
    for stale in _pending_files(folder):
        stale.unlink()
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()


def load_checkpoint(run_dir: Path) -> Checkpoint:
    """Read ``run_dir/checkpoint.json``; a clear error says why a run cannot be resumed."""
    path = run_dir / CHECKPOINT_FILE
    if not path.exists():
        if (run_dir / RESUMING_FILE).exists():
            where = shlex.quote(str(run_dir))
            raise UserInputError(
                f"a resume of {run_dir} is running or was interrupted ({RESUMING_FILE} exists); "
                "steps may have run since the checkpoint, so it is not resumed twice. If no "
                f"resume is running: start the run again (hierplan run ... -o {where}), or "
                f"rename {RESUMING_FILE} to {CHECKPOINT_FILE} to resume from the checkpoint "
                "anyway (steps that ran since may run again)"
            )
        if (run_dir / "run.json").exists():
            raise UserInputError(
                f"{run_dir} holds a run that is not paused (no {CHECKPOINT_FILE}): "
                "nothing to resume"
            )
        raise UserInputError(f"{run_dir} is not a paused run directory (no {CHECKPOINT_FILE})")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserInputError(f"cannot read {path}: {exc}") from None
    _check_format(path, text)
    try:
        return Checkpoint.model_validate_json(text)
    except ValidationError as exc:
        raise UserInputError(
            f"{path} is not a hierplan checkpoint ({exc.error_count()} problem(s); first, at "
            f"{first_problem(exc, 'the file')})"
        ) from None


def _check_format(path: Path, text: str) -> None:
    """Refuse a checkpoint of another format before reading its fields: another hierplan
    version's checkpoint has other fields, and its format says why they do not match."""
    try:
        data = json.loads(text)
    except ValueError:
        return  # not JSON: the checkpoint's validation says where
    found = data.get("format", CHECKPOINT_FORMAT) if isinstance(data, dict) else None
    if found is None or found == CHECKPOINT_FORMAT:
        return
    newer = isinstance(found, int) and not isinstance(found, bool) and found > CHECKPOINT_FORMAT
    raise UserInputError(
        f"{path} has checkpoint format {found!r}; this hierplan reads format "
        f"{CHECKPOINT_FORMAT}: "
        + (
            "it was written by a newer hierplan, resume it with that version"
            if newer
            else "resume it with the hierplan version that paused it"
        )
    )
