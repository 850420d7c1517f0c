"""A paused run's checkpoint: ``checkpoint.json`` and ``pending/<node>.yaml``.

When an approver defers a plan, the run stops once nothing runs any more, and its directory
keeps everything a resume needs: the run record (every node, plan version and decision, what
was spent), every finished step's result, the run's spec (how it was started: goal, models,
settings, budget; never a key), the paused run's workflow span when it was traced (the
resumed run's trace links to it), and each pending plan as YAML for people to read and edit.
A checkpoint is used once: a resume renames it ``checkpoint.resuming.json`` while it runs.

Format 2 keeps the run's spec under ``spec``; a format-1 checkpoint (an ``invocation``) is
read as one.
"""

from __future__ import annotations

import json
import re
import shlex
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from hierplan.core.results import StepResult
from hierplan.core.views import SpanIds
from hierplan.durable.restore import Restore
from hierplan.errors import UserInputError, first_problem
from hierplan.files import make_directory, write_atomic
from hierplan.models.provider import one_line
from hierplan.plans.decisions import Decision, Edit
from hierplan.plans.plan import plan_to_yaml
from hierplan.records import NodeRecord, PlanVersion, RunResult

CHECKPOINT_FILE = "checkpoint.json"
RESUMING_FILE = "checkpoint.resuming.json"
PENDING_DIR = "pending"
CHECKPOINT_FORMAT = 2
_READ_FORMATS = (1, 2)


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
    spec: dict[str, Any]
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
            spec=dict(self.spec),
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
    results: Mapping[str, StepResult],
    spec: Mapping[str, Any],
    extra: Mapping[str, Any] | None = None,
    workflow_span: SpanIds | None = None,
) -> Path:
    """Save a paused run in ``run_dir``: ``checkpoint.json`` and ``pending/<node>.yaml``.
    ``results``: each finished node's result by path; ``spec``: how to start the run again;
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
        spec=_jsonable(dict(spec)),
        extra=_jsonable(dict(extra or {})),
        results={
            path: SavedResult(output=_jsonable(r.output), text=r.text)
            for path, r in results.items()
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
    data = _checked_format(path, text)
    try:
        if data is None:
            return Checkpoint.model_validate_json(text)
        return Checkpoint.model_validate(data)
    except ValidationError as exc:
        raise UserInputError(
            f"{path} is not a hierplan checkpoint ({exc.error_count()} problem(s); first, at "
            f"{first_problem(exc, 'the file')})"
        ) from None


def _checked_format(path: Path, text: str) -> dict[str, Any] | None:
    """Refuse a checkpoint of a format this hierplan does not read, before reading its fields
    (another version's checkpoint has other fields, and its format says why they do not
    match); a format-1 checkpoint comes back as format 2, anything else as ``None`` (read
    as it is)."""
    try:
        data = json.loads(text)
    except ValueError:
        return None  # not JSON: the checkpoint's validation says where
    found = data.get("format", 1) if isinstance(data, dict) else None
    if found == 1 and isinstance(data, dict) and "invocation" in data:
        return _upgraded(data)
    if found is None or found in _READ_FORMATS:
        return None
    newer = isinstance(found, int) and not isinstance(found, bool) and found > CHECKPOINT_FORMAT
    raise UserInputError(
        f"{path} has checkpoint format {found!r}; this hierplan reads formats "
        f"{' and '.join(map(str, _READ_FORMATS))}: "
        + (
            "it was written by a newer hierplan, resume it with that version"
            if newer
            else "resume it with the hierplan version that paused it"
        )
    )


def _upgraded(data: dict[str, Any]) -> dict[str, Any]:
    """A format-1 checkpoint as format 2: its ``invocation`` (the arguments of the run it
    saved) as the run's spec."""
    inv = data.pop("invocation")
    if not isinstance(inv, dict):
        return data | {"format": 2, "spec": inv}  # validation says what is wrong
    budget = inv.get("budget") or {}
    simulator = {
        "profile": inv.get("sim_profile", "typical"),
        "latency_scale": inv.get("sim_latency_scale", 1.0),
    }

    def choice(model: Any, is_object: bool = False) -> Any:
        if model is None:
            return {"object": "model"} if is_object else None
        if not isinstance(model, str) or model.partition(":")[0].strip().lower() != "sim":
            options = dict(inv.get("model_options") or {})
            if not options:
                return model
            known = {
                k: options.pop(k) for k in ("base_url", "timeout_s", "priced_as") if k in options
            }
            return {"provider": {"name": model, **known, "options": options}}
        priced_as = model.partition(":")[2].strip() or None
        return {"simulator": simulator | {"priced_as": priced_as}}

    spec = {
        "goal": inv.get("goal"),
        "scenario": inv.get("scenario"),
        "settings": inv.get("settings"),
        "model": choice(inv.get("model"), True),
        "executor_model": choice(inv.get("executor_model"), bool(inv.get("executor_model_object"))),
        "budget": None
        if budget.get("budget_usd") is None and budget.get("budget_tokens") is None
        else {
            "usd": budget.get("budget_usd"),
            "tokens": budget.get("budget_tokens"),
            "allocation": budget.get("allocation", "equal"),
        },
        "price_in": budget.get("price_in"),
        "price_out": budget.get("price_out"),
        "workdir": inv.get("workdir"),
        "tools": inv.get("tools", []),
    }
    return data | {"format": 2, "spec": spec}


def checkpoint_run_id(run_dir: Path) -> str:
    """The id of the run paused in ``run_dir``, read without checking the rest of its
    checkpoint (``""`` when it cannot be read: the resume then says why)."""
    try:
        data = json.loads((run_dir / CHECKPOINT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    run_id = data.get("run_id") if isinstance(data, dict) else None
    return run_id if isinstance(run_id, str) else ""
