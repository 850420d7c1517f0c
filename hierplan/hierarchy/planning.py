"""Planning a node: propose a plan (or a replan), pass it through the gate, keep every version.

:func:`obtain_plan` asks the planner, records the proposal as a plan version (with its diff
against the plan it replaces), has the gate decide, and sends invalid or rejected plans back to
the planner a bounded number of times. A deferred plan pauses the run here; in a resumed run the
node's approved plan is used again. :class:`PlanPolicy` says how a strategy plans and executes.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass

from hierplan.agents.costs import BudgetCheck
from hierplan.agents.prompts import JoinDecision, JoinParseError
from hierplan.core.events import PlanDecided, PlanProposed, Replanned
from hierplan.core.results import StepResult
from hierplan.core.spend import Cost
from hierplan.durable.restore import PlanState, invalid_feedback, rejection_feedback
from hierplan.errors import (
    BudgetExceeded,
    ModelAuthError,
    ModelError,
    PlanParseError,
    SimulatorCoverageError,
    StepFailed,
    UnexpectedModelCall,
)
from hierplan.hierarchy.context import NodeContext
from hierplan.hierarchy.gate import GateContext, GateOutcome
from hierplan.plans.decisions import Decision
from hierplan.plans.plan import Plan, diff_plans
from hierplan.plans.revision import carried_over
from hierplan.records import DecisionRecord, PlanVersion
from hierplan.units import usd_to_pico


@dataclass(slots=True, frozen=True)
class PlanPolicy:
    """How a strategy plans and executes.

    ``flat``: plans may not contain sub-goals. ``sequential``: one step of a plan at a time.
    ``replan_on_failure``: a failed step leads to a replan (up to ``max_replans``).
    ``replan_each_step``: replan after every finished step (interleaved planning).
    ``as_needed``: each task is first attempted directly and decomposed only if that fails.
    """

    flat: bool = False
    sequential: bool = False
    replan_on_failure: bool = True
    replan_each_step: bool = False
    as_needed: bool = False


def _gate_context(
    node: NodeContext,
    plan: Plan,
    version: PlanVersion,
    previous: Plan | None,
    policy: PlanPolicy,
    check: BudgetCheck | None,
) -> GateContext:
    settings = node.run.settings
    if previous is None and version.version > 1:
        previous = _plan_before(node, version)
    return GateContext(
        path=node.path,
        goal=node.record.goal,
        depth=node.depth,
        max_depth=node.depth if policy.flat else settings.max_depth,
        max_steps=settings.max_steps,
        allowed_tools=node.allowed_tools,
        toolbox=node.run.toolbox,
        version=version.version,
        reason=version.reason,
        previous=previous,
        diff=version.diff,
        budget=node.record.budget,
        step=node.step,
        simulated=node.run.planner_model.simulated,
        usd_per_token=_dearest_token_price(node),
        budget_check=check,
    )


def _dearest_token_price(node: NodeContext) -> float | None:
    """USD per token at the dearest rate (input or output) of the run's models, or ``None``
    when one of them has no price. Dearest, so that a token estimate read as dollars errs
    towards review."""
    run = node.run
    rates = 0.0
    for model in (run.planner_model, run.executor_model):
        price = run.pricing.lookup(model.priced_as)
        if price is None:
            return None
        rates = max(rates, price.input_per_mtok, price.output_per_mtok)
    return rates / 1e6


def _plan_before(node: NodeContext, version: PlanVersion) -> Plan | None:
    """The proposal ``version`` replaces (refused edits are not proposals)."""
    earlier = [
        v
        for v in node.record.plan_versions
        if v.version < version.version and not (v.reason == "edit" and v.decision == "invalid")
    ]
    return earlier[-1].plan if earlier else None


def add_version(node: NodeContext, plan: Plan, reason: str, previous: Plan | None) -> PlanVersion:
    versions = node.record.plan_versions
    version = PlanVersion(
        version=len(versions) + 1,
        plan=plan,
        reason=reason,
        created_at=time.time(),
        diff=None if previous is None else diff_plans(previous, plan),
    )
    versions.append(version)
    run = node.run
    if run.bus.wants("plan_proposed"):
        run.bus.emit(
            PlanProposed(
                run_id=run.run_id,
                path=node.path,
                version=version.version,
                reason=reason,
                plan=plan.model_dump(mode="json"),
            )
        )
    return version


def announce_replan(node: NodeContext, version: PlanVersion, running: Plan) -> None:
    """Tell listeners the running plan was replaced: once the new plan is decided (a proposal
    the gate refuses never runs; a streamed one, once it is written), with the diff against
    the plan it replaces."""
    run = node.run
    if not run.bus.wants("replanned"):
        return
    diff = diff_plans(running, version.plan)
    run.bus.emit(
        Replanned(
            run_id=run.run_id,
            path=node.path,
            version=version.version,
            reason="replan",
            diff=diff.summary(),
            added=list(diff.added),
            removed=list(diff.removed),
            changed=list(diff.changed),
        )
    )


def decide(node: NodeContext, version: PlanVersion, outcome: GateOutcome) -> None:
    version.decision = outcome.kind
    version.decided_by = outcome.by
    version.decided_at = time.time()
    version.note = outcome.note
    version.problems = list(outcome.problems)
    version.history.append(
        DecisionRecord(
            outcome.kind, outcome.by, version.decided_at, outcome.note, list(outcome.problems)
        )
    )
    run = node.run
    if run.bus.wants("plan_decided"):
        run.bus.emit(
            PlanDecided(
                run_id=run.run_id,
                path=node.path,
                version=version.version,
                decision=outcome.kind,
                decided_by=outcome.by,
                note=outcome.note,
                problems=outcome.problems,
            )
        )


async def _propose(
    node: NodeContext,
    policy: PlanPolicy,
    inputs: Mapping[str, StepResult],
    previous: Plan | None,
    progress: Mapping[str, StepResult] | None,
    failure: str | None,
    feedback: str | None,
    whole: bool = True,
) -> Plan:
    run = node.run
    texts = {k: v.text for k, v in inputs.items()}
    reason = "initial" if previous is None else "replan"
    scopes = [i.planning_scope(node, reason) for i in run.instruments]
    async with AsyncExitStack() as stack:
        for scope in scopes:
            if scope is not None:
                await stack.enter_async_context(scope)
        try:
            if previous is None:
                return await run.planner.plan(
                    node, inputs=texts, feedback=feedback, flat=policy.flat
                )
            done = {k: v.text for k, v in (progress or {}).items()}
            return await run.planner.replan(
                node,
                previous,
                done,
                failure,
                inputs=texts,
                feedback=feedback,
                flat=policy.flat,
                whole=whole,
            )
        except PlanParseError as exc:
            raise StepFailed(str(exc)) from None
        except SimulatorCoverageError as exc:
            raise StepFailed(str(exc)) from None
        except (ModelAuthError, UnexpectedModelCall):
            raise
        except ModelError as exc:
            # The model call failed after its retries: this node fails (its parent may replan)
            # rather than the whole run.
            raise StepFailed(f"planning failed: {exc}") from None


async def ask_joiner(
    node: NodeContext, results: Mapping[str, StepResult], draft: str
) -> JoinDecision | None:
    """The joiner's decision on a node whose steps are done (see
    :meth:`~hierplan.agents.planner.LLMPlanner.join`), inside every instrument's planning
    scope (reason ``join``). ``None`` when there is none to follow: an answer that did not read
    after its repairs (flag ``join_unread``), a call the budget refused (``join_no_budget``)
    or that failed after its retries (``join_failed``); the node then answers from its results,
    as without a joiner."""
    run = node.run
    scopes = [i.planning_scope(node, "join") for i in run.instruments]
    texts = {k: v.text for k, v in results.items()}
    async with AsyncExitStack() as stack:
        for scope in scopes:
            if scope is not None:
                await stack.enter_async_context(scope)
        try:
            return await run.planner.join(node, texts, draft)
        except JoinParseError:
            flag = "join_unread"
        except BudgetExceeded:
            flag = "join_no_budget"
        except (ModelAuthError, UnexpectedModelCall):
            raise
        except ModelError:
            flag = "join_failed"
    node.record.flags.append(flag)
    return None


async def obtain_plan(
    node: NodeContext,
    policy: PlanPolicy,
    inputs: Mapping[str, StepResult],
    *,
    previous: Plan | None = None,
    progress: Mapping[str, StepResult] | None = None,
    failure: str | None = None,
    feedback: str | None = None,
    reason: str | None = None,
    invalid: int = 0,
    whole: bool = True,
) -> Plan:
    """A plan the gate approved (or an approved edit of it).

    ``reason`` labels the first version proposed (by default ``initial``, or ``replan`` with
    a ``previous`` plan). ``invalid``: invalid proposals already made (a streamed plan
    refused), which count towards ``max_invalid_plans``. ``whole``: ``previous`` is a whole
    plan, not one cut short while it was written (whose unconsumed done steps are no answers).

    Invalid plans return to the planner with the validators' findings, rejected ones with the
    reviewer's reason; past ``max_invalid_plans`` or ``max_rejections`` the node fails. A
    deferred plan pauses the run here. In a resumed run, the node's approved plan is used again
    and a pending one gets the decision made outside the run.
    """
    settings = node.run.settings
    pause = node.run.pause
    restore = node.run.restore
    rejections = 0
    reason = reason or ("initial" if previous is None else "replan")
    pending: PlanVersion | None = None
    restored = None if restore is None else restore.plan_state(node.record)
    if restored is not None:
        if restored.approved is not None:
            return restored.approved
        pending, feedback = restored.pending, restored.feedback
        invalid, rejections = restored.invalid, restored.rejections
        previous, progress, reason = _resumed_context(node, restored)
    while True:
        with pause.working():
            if pending is None:
                plan = await _propose(
                    node, policy, inputs, previous, progress, failure, feedback, whole
                )
                version = add_version(node, plan, reason, previous or _last_plan(node))
                decision = None
            else:
                version, pending = pending, None
                assert restore is not None  # only a restored node has a pending version
                plan, decision = version.plan, restore.decision_for(node.path)
            outcome, check = await _review(node, policy, version, previous, progress, decision)
        if outcome.kind == "pending":
            await pause.hold()
        if outcome.kind in ("approved", "edited"):
            return _accepted(node, version, outcome, previous)
        if outcome.kind == "invalid":
            invalid += 1
            if invalid > settings.max_invalid_plans:
                raise _too_many_invalid(node, invalid, outcome, check)
            feedback = invalid_feedback(outcome.problems)
        else:
            rejections += 1
            if rejections > settings.max_rejections:
                raise StepFailed(
                    f"plan rejected {rejections} times; last reason: {outcome.note}",
                    status="rejected",
                )
            feedback = rejection_feedback(outcome.note)
        reason = "retry"


async def _review(
    node: NodeContext,
    policy: PlanPolicy,
    version: PlanVersion,
    previous: Plan | None,
    progress: Mapping[str, StepResult] | None,
    decision: Decision | None,
) -> tuple[GateOutcome, BudgetCheck | None]:
    """The gate's outcome for ``version`` (with ``decision`` when one was made outside the
    run), recorded on it, and the budget check the gate was given."""
    plan = version.plan
    check = await _budget_check(node, _standing(previous, plan, progress))
    outcome = await node.run.gate.review(
        plan, _gate_context(node, plan, version, previous, policy, check), decision
    )
    decide(node, version, outcome)
    _record_refused(node, plan, outcome)
    if check is not None and outcome.kind in ("approved", "edited"):
        node.step_costs = check.least(outcome.plan)[1]
    return outcome, check


def _accepted(
    node: NodeContext, version: PlanVersion, outcome: GateOutcome, previous: Plan | None
) -> Plan:
    """The plan to run after ``outcome`` approved ``version`` or an edit of it (recorded as a
    version of its own)."""
    if outcome.kind == "edited":
        version = add_version(node, outcome.plan, "edit", version.plan)
        decide(node, version, GateOutcome("approved", outcome.plan, outcome.by, outcome.note))
    if previous is not None:
        announce_replan(node, version, previous)
    return version.plan


def _too_many_invalid(
    node: NodeContext, invalid: int, outcome: GateOutcome, check: BudgetCheck | None
) -> StepFailed:
    """The failure of a node whose planner proposed ``invalid`` plans, one too many."""
    if check is not None and check.refused:
        return StepFailed(_no_plan_fits(node, check), status="budget_exhausted")
    return StepFailed(
        f"the planner proposed {invalid} invalid plans; last problems: "
        + "; ".join(outcome.problems)
    )


def _standing(
    previous: Plan | None, plan: Plan, progress: Mapping[str, StepResult] | None
) -> Collection[str]:
    """The steps of ``plan`` whose results stand (done, and not redone)."""
    if previous is None or not progress:
        return progress or ()
    return carried_over(previous, plan, progress)


async def _budget_check(node: NodeContext, progress: Collection[str] | None) -> BudgetCheck | None:
    """The budget check of the node's next plan, when a budget limits the node: what it has
    left now (its planning calls have settled), the steps done counting nothing."""
    spending = await node.spending()
    if spending is None:
        return None
    return BudgetCheck(node, spending, done=progress or ())


def _no_plan_fits(node: NodeContext, check: BudgetCheck) -> str:
    """Why a node ends when no plan its planner wrote fits its budget, with the budget that
    would have done: what it had used so far and the least cost of the cheapest plan."""
    spending, cheapest = check.spending, check.cheapest_refused
    assert cheapest is not None
    figures = node.record.budget or {}
    tokens, pico = spending.left
    used_t = (figures.get("limit_tokens") or 0) - (tokens or 0)
    limit_usd = figures.get("limit_usd")
    used_p = 0 if limit_usd is None else usd_to_pico(limit_usd) - (pico or 0)
    smallest = spending.text(Cost(max(0, used_t) + cheapest.tokens, max(0, used_p) + cheapest.pico))
    where = (
        f"give the run a budget of at least {smallest}"
        if node.parent is None
        else f"this sub-goal would have needed a budget of {smallest}: give the run more"
    )
    return (
        f"no plan fits this node's budget: the cheapest plan proposed needs at least "
        f"{spending.text(cheapest)} and {spending.left_text()} is left; {where}"
    )


def _resumed_context(
    node: NodeContext, restored: PlanState
) -> tuple[Plan | None, Mapping[str, StepResult] | None, str]:
    """``previous``, ``progress`` and the next version's reason for a restored node."""
    restore = node.run.restore
    if restored.previous is None or restore is None:
        return None, None, "retry"
    return restored.previous, restore.done_for(node.record, restored.previous), "replan"


def _record_refused(node: NodeContext, plan: Plan, outcome: GateOutcome) -> None:
    """Keep every edit the validators refused as a plan version, for the audit trail."""
    for refused in outcome.refused:
        version = add_version(node, refused.plan, "edit", plan)
        version.created_at = refused.at
        decide(
            node,
            version,
            GateOutcome(
                "invalid",
                refused.plan,
                "validators",
                refused.message,
                problems=list(refused.problems),
            ),
        )


def _last_plan(node: NodeContext) -> Plan | None:
    versions = node.record.plan_versions
    return versions[-1].plan if versions else None
