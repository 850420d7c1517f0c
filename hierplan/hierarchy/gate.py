"""The validation gate every plan and replan passes before any of its steps runs.

First the validators (structure: ids, dependencies, cycles, size, depth, ``$id`` references; tools
allowed for this node; tool arguments against each tool's schema), then the approver. The approver's
decision is one of :class:`Approve`, :class:`Edit` (a replacement plan, validated again),
:class:`Reject` (the reason goes back to the planner) or :class:`Defer` (no decision now: the run
pauses and keeps the plan for a decision from outside, see :func:`hierplan.resume`).
:class:`AutoApprove` approves everything; :class:`CallbackApprover` asks a function (sync or async),
for platforms that review elsewhere. An approver other than the automatic one is shown a copy
of the plan; a copy it changed in place and approved is its edit. An approver may check an edit
itself with :meth:`GateContext.validate` before it returns it; every edit the validators refuse
is kept for the audit trail.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

import anyio
import anyio.from_thread
import anyio.lowlevel
from pydantic import ValidationError

from hierplan.durable.checkpoint import pending_versions
from hierplan.durable.restore import Restore
from hierplan.errors import ToolArgsError, UserInputError, field_problems, is_positive_seconds
from hierplan.plans.decisions import Approve, Decision, Defer, Edit, Reject
from hierplan.plans.plan import Plan, PlanDiff, PlanProblem, Step, step_refs, validate_plan
from hierplan.records import NodeRecord
from hierplan.tools.base import Toolbox

if TYPE_CHECKING:
    from hierplan.hierarchy.context import RunContext

T = TypeVar("T")


@dataclass(slots=True, frozen=True)
class RefusedEdit:
    """An edited plan the validators refused, with their findings and ``by``, the reviewer who
    made the edit (kept for the audit trail). An edit checked with :meth:`GateContext.validate`
    without a name is put down to the reviewer whose decision follows it."""

    plan: Plan
    problems: tuple[str, ...]
    at: float
    by: str | None = None

    @property
    def message(self) -> str:
        """One line for the audit trail: who made the edit and that it was refused."""
        return f"edit by {self.by or 'the reviewer'} refused"


# The limits a plan's structure is checked under: allowed tools, steps, depth, deepest depth.
_Limits = tuple[frozenset[str], int, int, int]


@dataclass(slots=True, frozen=True)
class GateContext:
    """What the gate and the approver know about the plan under review.

    ``step`` is the step of the parent's plan that made this node (``None`` at the root);
    ``budget`` is the node's budget when a budget instrument set one; ``previous`` and ``diff``
    describe the version this plan replaces. ``problems`` holds the validators' findings on the
    approver's last edit, when it was refused.
    """

    path: str
    goal: str
    depth: int
    max_depth: int
    max_steps: int
    allowed_tools: frozenset[str]
    toolbox: Toolbox
    version: int
    reason: str
    previous: Plan | None = None
    diff: PlanDiff | None = None
    budget: dict[str, Any] | None = None
    problems: tuple[str, ...] = ()
    step: Step | None = None
    validators: tuple[Validator, ...] = ()
    refused: list[RefusedEdit] = field(default_factory=list)
    simulated: bool = False
    """Whether the plan came from the offline simulator (a reviewer is told so)."""
    usd_per_token: float | None = None
    """The dearest USD price of one token among the run's models (``None`` when one has no
    price): what reads a planner's token estimate as dollars."""
    budget_check: Callable[[Plan], list[PlanProblem]] | None = None
    """The node's budget check (see :class:`~hierplan.agents.costs.BudgetCheck`), when a
    budget limits it."""
    _structure: dict[int, tuple[Plan, _Limits, list[PlanProblem]]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def structure_problems(self, plan: Plan) -> list[PlanProblem]:
        """What :func:`~hierplan.plans.plan.validate_plan` finds in ``plan`` under this
        context's limits, worked out once a plan: the structure validator and the budget
        validator (which costs only a sound plan) both ask."""
        key = (self.allowed_tools, self.max_steps, self.depth, self.max_depth)
        found = self._structure.get(id(plan))
        if found is None or found[0] is not plan or found[1] != key:
            problems = validate_plan(
                plan,
                tools=self.allowed_tools,
                max_steps=self.max_steps,
                depth=self.depth,
                max_depth=self.max_depth,
            )
            found = self._structure[id(plan)] = (plan, key, problems)
        return list(found[2])

    @property
    def is_root(self) -> bool:
        """Whether this is the root plan of the run."""
        return self.depth == 1

    def validate(self, plan: Plan, *, by: str | None = None) -> list[PlanProblem]:
        """Every problem the gate's validators find in ``plan`` (an edit, usually).

        A plan with problems is recorded as a refused edit made ``by`` that reviewer (by
        default, whoever makes the decision that follows), so that the audit trail shows what
        a reviewer tried even when they fix it before deciding.
        """
        # The plan as it is now: an approver may check its copy, change it in place and check
        # it again, and the checks' figures are kept by plan (as is what the record keeps).
        plan = copied(plan)
        problems: list[PlanProblem] = []
        for validator in self.validators:
            problems.extend(validator(plan, self))
        if problems:
            found = tuple(str(p) for p in problems)
            self.refused.append(RefusedEdit(plan, found, time.time(), by))
        return problems


class Approver(Protocol):
    """Decides on a valid plan. ``review`` may take as long as a human needs."""

    async def review(self, plan: Plan, ctx: GateContext) -> Decision:
        """Approve, edit, reject or defer ``plan``."""
        ...


class AutoApprove:
    """Approves every valid plan."""

    async def review(self, plan: Plan, ctx: GateContext) -> Decision:
        """Approve."""
        return Approve(by="auto")


ReviewFunction = Callable[[Plan, GateContext], Decision | Awaitable[Decision]]
"""The function a :class:`CallbackApprover` calls on each valid plan (sync or async)."""


class CallbackApprover:
    """Asks a function (sync or async) for each decision: the hook for embedding hierplan.

    The function gets the plan and its :class:`GateContext` (node path, goal, depth, version,
    the previous version and the diff after a replan, the node's budget) and returns
    :class:`Approve`, :class:`Edit`, :class:`Reject` or :class:`Defer`. An async function may
    wait as long as a reviewer needs (a chat reply, a ticket): the rest of the run goes on
    meanwhile, and several sub-goals may wait at once. A sync function runs in a daemon thread
    (with the caller's context variables), so that one that blocks (``input()``) does not stop
    the rest of the run. With ``timeout_s``, a decision that takes longer becomes
    ``on_timeout`` (by default :class:`Defer`: the run pauses and can be resumed), whether the
    function is sync or async.

    >>> async def review(plan, ctx):
    ...     return Approve(by="ticket-123") if len(plan.steps) < 10 else Reject("too long")
    >>> approver = CallbackApprover(review)
    """

    def __init__(
        self,
        function: ReviewFunction,
        *,
        name: str = "callback",
        timeout_s: float | None = None,
        on_timeout: Decision | None = None,
    ) -> None:
        if timeout_s is not None and not is_positive_seconds(timeout_s):
            raise UserInputError(
                f"CallbackApprover {name!r}: timeout_s must be None or a number of seconds "
                f"more than 0, not {timeout_s!r}"
            )
        self.function = function
        self.name = name
        self.timeout_s = timeout_s
        self.on_timeout: Decision = on_timeout or Defer(
            by=name, note=f"no decision within {timeout_s} s"
        )

    async def review(self, plan: Plan, ctx: GateContext) -> Decision:
        """Call the function and return its decision."""
        if self.timeout_s is None:
            return await self._call(plan, ctx)
        with anyio.move_on_after(self.timeout_s):
            # A function the timeout leaves running still holds what it was given: it gets a
            # copy of its own, so that what it has changed so far is not taken as approved.
            own = copied(plan)
            return as_decided(await self._call(own, ctx), own, plan)
        return self.on_timeout

    async def _call(self, plan: Plan, ctx: GateContext) -> Decision:
        function = self.function
        if _is_async(function):
            result = function(plan, ctx)
        else:
            # A sync function may block (input(), a blocking HTTP call): run it off the event
            # loop, so that the rest of the run goes on and the timeout can end the wait.
            result = await in_daemon_thread(lambda: function(plan, ctx))
        decision = await result if inspect.isawaitable(result) else result
        if not isinstance(decision, Approve | Edit | Reject | Defer):
            raise TypeError(
                f"review callback {self.name!r} returned {decision!r}; return Approve(), "
                "Edit(plan), Reject(reason) or Defer()"
            )
        return decision


def _is_async(function: Callable[..., Any]) -> bool:
    """Whether calling ``function`` only makes a coroutine (a function, a partial, an object
    with an ``async def __call__``)."""
    return inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(
        getattr(function, "__call__", None)  # noqa: B004 (an object's async __call__)
    )


async def in_daemon_thread(func: Callable[[], T]) -> T:
    """Run blocking ``func`` in a daemon thread, with the caller's context variables, and wait
    for it without blocking the event loop.

    Unlike a worker thread of anyio's pool, a daemon thread left waiting (for input, say) does
    not keep the process alive at exit. Cancelling the wait (a timeout) leaves the thread to
    finish on its own; its result is dropped.
    """
    token = anyio.lowlevel.current_token()
    context = contextvars.copy_context()
    done = anyio.Event()
    box: list[tuple[bool, object]] = []

    def target() -> None:
        try:
            box.append((True, context.run(func)))
        except BaseException as exc:
            box.append((False, exc))
        finally:
            with contextlib.suppress(anyio.RunFinishedError):
                anyio.from_thread.run_sync(done.set, token=token)

    threading.Thread(target=target, name="hierplan-review", daemon=True).start()
    await done.wait()
    ok, value = box[0]
    if not ok:
        assert isinstance(value, BaseException)
        raise value
    return value  # type: ignore[return-value]


Validator = Callable[[Plan, GateContext], list[PlanProblem]]


def structure_validator(plan: Plan, ctx: GateContext) -> list[PlanProblem]:
    """Ids, dependencies, cycles, size, depth, tools allowed for this node, and ``$id``
    references to steps it does not depend on."""
    return ctx.structure_problems(plan)


def args_validator(plan: Plan, ctx: GateContext) -> list[PlanProblem]:
    """Tool arguments match the tool's schema (``$id`` references are checked with the
    structure, by :func:`~hierplan.plans.plan.validate_plan`)."""
    problems: list[PlanProblem] = []
    ids = {s.id for s in plan.steps}
    for step in plan.steps:
        problems.extend(step_args_problems(step, ids, ctx))
    return problems


def step_args_problems(step: Step, ids: set[str], ctx: GateContext) -> list[PlanProblem]:
    """What :func:`args_validator` finds in one step of a plan whose step ids are ``ids``: a
    streamed plan checks each step as it comes, not again with every step after it."""
    if step.tool is None or step.args is None or step.tool not in ctx.toolbox:
        return []
    return _args_problems(step, ctx.toolbox, has_refs=bool(step_refs(step, ids)))


def _args_problems(step: Step, toolbox: Toolbox, *, has_refs: bool) -> list[PlanProblem]:
    assert step.tool is not None and step.args is not None
    if not has_refs:
        try:
            toolbox.check_planned(step.tool, step.args)
        except ToolArgsError as exc:
            return [PlanProblem("bad_args", f"step {step.id!r}: {exc}", step.id)]
        return []
    # With references the values are only known at run time: check the names alone.
    target = toolbox.get(step.tool)
    props = target.parameters.get("properties", {})
    required = set(target.parameters.get("required", []))
    out = [
        PlanProblem("bad_args", f"step {step.id!r}: tool {step.tool!r} has no arg {k!r}", step.id)
        for k in step.args
        if props and k not in props
    ]
    out.extend(
        PlanProblem("bad_args", f"step {step.id!r}: missing arg {k!r} of {step.tool!r}", step.id)
        for k in sorted(required - set(step.args))
    )
    return out


def budget_validator(plan: Plan, ctx: GateContext) -> list[PlanProblem]:
    """The plan's least cost fits what its node has left (only under a budget, and only for a
    plan whose structure is sound: the cost of a broken plan means nothing)."""
    if ctx.budget_check is None or ctx.structure_problems(plan):
        return []
    return ctx.budget_check(plan)


DEFAULT_VALIDATORS: tuple[Validator, ...] = (structure_validator, args_validator, budget_validator)


@dataclass(slots=True)
class GateOutcome:
    """What the gate decided, and on which plan."""

    kind: Literal["approved", "edited", "rejected", "invalid", "pending"]
    plan: Plan
    by: str
    note: str = ""
    problems: list[str] = field(default_factory=list)
    refused: list[RefusedEdit] = field(default_factory=list)


class Gate:
    """Validators, then the approver; see the module docstring."""

    def __init__(
        self,
        approver: Approver | None = None,
        *,
        validators: Sequence[Validator] = DEFAULT_VALIDATORS,
        max_edit_rounds: int = 3,
    ) -> None:
        self.approver: Approver = approver or AutoApprove()
        self.validators = tuple(validators)
        self.max_edit_rounds = max_edit_rounds

    def validate(self, plan: Plan, ctx: GateContext) -> list[PlanProblem]:
        """Every problem every validator finds."""
        problems: list[PlanProblem] = []
        for validator in self.validators:
            problems.extend(validator(plan, ctx))
        return problems

    async def review(
        self, plan: Plan, ctx: GateContext, decision: Decision | None = None
    ) -> GateOutcome:
        """Validate, then ask the approver; an invalid edit is sent back to the approver.

        ``decision``, when given, stands for the approver's first answer: a decision made
        outside the run (``hierplan resume``). An invalid edit then goes to the approver.
        """
        ctx = replace(ctx, validators=self.validators, refused=[])
        problems = self.validate(plan, ctx)
        if problems:
            return GateOutcome("invalid", plan, "validators", problems=[str(p) for p in problems])
        for _ in range(self.max_edit_rounds):
            if decision is None:
                decision = await self._ask(plan, ctx)
            if isinstance(decision, Approve):
                return GateOutcome(
                    "approved", plan, decision.by, decision.note, refused=ctx.refused
                )
            if isinstance(decision, Reject):
                return GateOutcome(
                    "rejected", plan, decision.by, decision.reason, refused=ctx.refused
                )
            if isinstance(decision, Defer):
                return GateOutcome("pending", plan, decision.by, decision.note, refused=ctx.refused)
            edit, decision = decision, None
            edited, edit_problems = _schema_checked(edit.plan)
            if not edit_problems:
                edit_problems = [str(p) for p in self.validate(edited, ctx)]
            if not edit_problems:
                return GateOutcome("edited", edited, edit.by, edit.note, refused=ctx.refused)
            if not ctx.refused or ctx.refused[-1].plan != edited:
                ctx.refused.append(RefusedEdit(edited, tuple(edit_problems), time.time(), edit.by))
            ctx = _with_problems(ctx, edit_problems)
        return GateOutcome(
            "rejected",
            plan,
            "validators",
            f"no valid edit after {self.max_edit_rounds} rounds: {'; '.join(ctx.problems)}",
            refused=ctx.refused,
        )

    async def _ask(self, plan: Plan, ctx: GateContext) -> Decision:
        """The approver's decision on ``plan``.

        A plan and its steps are frozen, but their lists and a step's arguments are not. So an
        approver other than the automatic one gets a copy of the plan: what it changes in place
        is neither what runs nor the version of the plan that the record keeps. A copy it
        changed and approved is an edit by the same reviewer, validated again like any other.
        (:class:`CallbackApprover` gives a function it may leave running past its timeout a
        copy of that function's own.)
        """
        before = len(ctx.refused)
        shown = plan if type(self.approver) is AutoApprove else copied(plan)
        decision = as_decided(await self.approver.review(shown, ctx), shown, plan)
        _put_down_to(ctx.refused, before, decision.by)
        return decision


def copied(plan: Plan) -> Plan:
    """A copy of ``plan`` that an approver may read and change, or ``plan`` itself when it
    cannot be copied (arguments a plan built in Python holds, such as a lock)."""
    try:
        return plan.model_copy(deep=True)
    except Exception:
        return plan


def as_decided(decision: Decision, shown: Plan, plan: Plan) -> Decision:
    """``decision`` on ``shown``, an approver's copy of ``plan``: approving a copy it changed in
    place is an edit, by the same reviewer."""
    if not isinstance(decision, Approve) or shown is plan:
        return decision
    try:
        changed = bool(shown != plan)
    except Exception:  # values that do not compare (an array): the edit path checks the copy
        changed = True
    return Edit(shown, by=decision.by, note=decision.note) if changed else decision


def _put_down_to(refused: list[RefusedEdit], start: int, by: str) -> None:
    """Name ``by`` as the author of the edits from ``start`` on that the approver checked
    itself (:meth:`GateContext.validate`) without saying who made them."""
    for i in range(start, len(refused)):
        if refused[i].by is None:
            refused[i] = replace(refused[i], by=by)


def _schema_checked(plan: Plan) -> tuple[Plan, list[str]]:
    """An edit's plan checked against the plan schema again, and what it found wrong.

    A plan the proposal's parser made has passed the schema, but an approver's edit need not
    have: ``Plan.model_construct`` (or ``model_copy(update=...)``) skips the field checks the
    validators rely on: the step id pattern that ``$id`` references match, the kinds, the
    length and estimate limits.
    """
    if not isinstance(plan, Plan):
        raise TypeError(f"Edit needs a Plan, not {type(plan).__name__}: Edit(Plan(...))")
    try:
        return Plan.model_validate(plan.model_dump(warnings=False)), []
    except ValidationError as exc:
        return plan, [f"the edited plan is not a valid plan: {field_problems(exc, 'plan')}"]


def _with_problems(ctx: GateContext, problems: list[str]) -> GateContext:
    return replace(ctx, problems=tuple(problems))


def check_decisions(run: RunContext, restore: Restore, *, flat: bool) -> None:
    """Check the outside decisions before a resumed run starts anything.

    Each must be for a pending plan; an edited plan must pass the gate's validators for its
    node. Raises :class:`UserInputError` naming what is wrong.
    """
    missing = sorted(set(restore.spec.get("tools", [])) - run.toolbox.names())
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
