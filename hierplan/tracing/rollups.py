"""Rollups: the usage, cost and budget figures agent, plan and workflow spans end with, computed
from the run record so that they agree with ``run.json``. Cost itself sits on ``chat`` spans
only; these are totals of the calls below a span, under ``gen_ai.aggregated_usage.*`` and
``hierplan.*``, so a backend that sums a trace's spans does not count a call twice."""

from __future__ import annotations

from dataclasses import dataclass

from opentelemetry.util.types import AttributeValue

from hierplan.core.views import RunView
from hierplan.records import NodeRecord
from hierplan.tracing.attributes import attribute_value
from hierplan.units import PICO_PER_USD


@dataclass(slots=True)
class _Totals:
    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    reasoning_tokens: int = 0
    cache_write_tokens: int = 0
    # The calls' costs by phase, in pico-dollars (exact sums, as run.json has them).
    planning: int = 0
    execution: int = 0
    calls: int = 0
    unpriced_calls: int = 0
    nodes: int = 0

    def add(self, record: NodeRecord) -> None:
        self.nodes += 1
        usage = record.usage
        self.input_tokens += usage.input_tokens
        self.output_tokens += usage.output_tokens
        self.cached_input_tokens += usage.cached_input_tokens
        self.reasoning_tokens += usage.reasoning_tokens
        self.cache_write_tokens += usage.cache_write_tokens
        self.planning += record.planning_cost_pico
        self.execution += record.execution_cost_pico
        self.calls += len(record.calls)
        self.unpriced_calls += record.unpriced_calls

    @property
    def cost_usd(self) -> float:
        """The calls' cost in USD."""
        return (self.planning + self.execution) / PICO_PER_USD

    def rollups(self, record: NodeRecord) -> dict[str, AttributeValue]:
        """These totals as the rollups of ``record``'s span, with its children and budget."""
        cost = self.cost_usd
        attributes: dict[str, AttributeValue] = {
            "gen_ai.aggregated_usage.input_tokens": self.input_tokens,
            "gen_ai.aggregated_usage.output_tokens": self.output_tokens,
            "gen_ai.aggregated_usage.cache_read.input_tokens": self.cached_input_tokens,
            "gen_ai.aggregated_usage.reasoning.output_tokens": self.reasoning_tokens,
            "gen_ai.aggregated_usage.cost": cost,
            "hierplan.cost.subtree_usd": cost,
            "hierplan.cost.planning_usd": self.planning / PICO_PER_USD,
            "hierplan.cost.execution_usd": self.execution / PICO_PER_USD,
            "hierplan.calls": self.calls,
            "hierplan.unpriced_calls": self.unpriced_calls,
        }
        if self.cache_write_tokens:
            # Only where a call wrote to a prompt cache (few runs do: hierplan asks for no
            # caching), so that other runs' spans carry no attribute that is always 0.
            attributes["gen_ai.aggregated_usage.cache_creation.input_tokens"] = (
                self.cache_write_tokens
            )
        if record.children:
            attributes["hierplan.children"] = len(record.children)
        for key, value in (record.budget or {}).items():
            converted = attribute_value(value)
            if converted is not None:
                attributes[f"hierplan.budget.{key}"] = converted
        return attributes


Tree = tuple[_Totals, dict[int, _Totals]]
"""The totals of a whole tree, and of each of its depths by depth."""


def tree_totals(root: NodeRecord) -> Tree:
    """The totals of ``root``'s tree and of each of its depths, in one walk: the root's agent
    span and the workflow span both end with them."""
    totals = _Totals()
    levels: dict[int, _Totals] = {}
    for node in root.walk():
        totals.add(node)
        level = levels.get(node.depth)
        if level is None:
            level = levels[node.depth] = _Totals()
        level.add(node)
    return totals, levels


def _subtree_rollups(record: NodeRecord, tree: Tree | None) -> dict[str, AttributeValue]:
    if tree is not None:
        return tree[0].rollups(record)
    totals = _Totals()
    for node in record.walk():
        totals.add(node)
    return totals.rollups(record)


def node_rollups(record: NodeRecord, tree: Tree | None = None) -> dict[str, AttributeValue]:
    """What an agent span ends with, besides its status. Agent spans start with
    ``hierplan.calls`` 0, so a leaf that made no model call (a direct tool step) gets no rollups
    at all: all of them would be zero, and leaves are the hot path. Under a budget it gets them
    all, ``hierplan.calls`` first, as the budget comes with them. ``tree``, when given, is
    :func:`tree_totals` of ``record``: its subtree is not walked again then."""
    if record.calls or record.children:
        attributes = _subtree_rollups(record, tree)
        attributes["hierplan.cost.node_usd"] = record.cost_usd
    elif record.budget:
        attributes = {"hierplan.calls": 0, **_subtree_rollups(record, tree)}
    else:
        attributes = {}
    if record.attempts > 1:
        attributes["hierplan.node.attempts"] = record.attempts
    if record.transient_retries:
        attributes["hierplan.node.transient_retries"] = record.transient_retries
    if record.plan_versions:
        attributes["hierplan.plan.versions"] = len(record.plan_versions)
    return attributes


def workflow_rollups(
    root: NodeRecord, run: RunView, tree: Tree | None = None
) -> dict[str, AttributeValue]:
    """What the workflow span ends with: the whole tree's rollups and one list per level.
    ``tree`` is :func:`tree_totals` of ``root`` when already known (walked otherwise)."""
    totals, levels = tree_totals(root) if tree is None else tree
    attributes = totals.rollups(root)
    # One list per figure, index i for depth i + 1: backends such as Phoenix read numeric key
    # segments ("hierplan.level.1.cost") as list indexes and would show them shifted.
    ordered = [levels[d] for d in sorted(levels)]
    attributes["hierplan.level.cost_usd"] = [t.cost_usd for t in ordered]
    attributes["hierplan.level.input_tokens"] = [t.input_tokens for t in ordered]
    attributes["hierplan.level.output_tokens"] = [t.output_tokens for t in ordered]
    attributes["hierplan.level.nodes"] = [t.nodes for t in ordered]
    attributes["hierplan.nodes"] = totals.nodes
    attributes["hierplan.node.status"] = root.status
    attributes["hierplan.peak_concurrent_leaves"] = run.peak_leaves
    return attributes


def planning_rollups(record: NodeRecord, first_call: int) -> dict[str, AttributeValue]:
    """What a ``plan`` span ends with: the planning calls ``record`` made from its call number
    ``first_call`` on (the calls of that round; a record's calls are only ever appended)."""
    input_tokens = output_tokens = calls = cost = 0
    for call in record.calls[first_call:]:
        if call.phase == "planning":
            input_tokens += call.usage.input_tokens
            output_tokens += call.usage.output_tokens
            cost += call.cost_pico or 0
            calls += 1
    return {
        "gen_ai.aggregated_usage.input_tokens": input_tokens,
        "gen_ai.aggregated_usage.output_tokens": output_tokens,
        "gen_ai.aggregated_usage.cost": cost / PICO_PER_USD,
        "hierplan.calls": calls,
    }
