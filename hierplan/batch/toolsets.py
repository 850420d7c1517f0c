"""The toolsets of a batch's goals: checked before anything starts, and shared where a ``tools``
entry says ``shared: true``.

Every goal opens its own servers (its run does, as any run does), except for entries marked
``shared``: those are opened once per process (the batch's, or each Celery worker's) by
:class:`SharedToolsets` when a goal first needs them, and closed when the batch (or the worker)
ends. :func:`check_goal_toolsets` finds, before the batch starts, what would stop a goal's
toolsets: problems found without starting anything on every backend (a bad entry, and locally a
variable not set, a command not found, a module that does not import), and, on the local
backend, by opening each distinct entry once: a server that cannot start, two tools of one name.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING, TextIO

import anyio
from anyio.abc import TaskGroup, TaskStatus

from hierplan.errors import HierplanError, UserInputError
from hierplan.tools.base import Tool, Toolset
from hierplan.tools.config import ToolsetSpec, toolset_problems

if TYPE_CHECKING:
    from hierplan.batch.goals import BatchGoal

PROBES_AT_ONCE = 8
"""Entries opened at once when a batch checks its toolsets before it starts."""


def entry_key(entry: ToolsetSpec) -> str:
    """What makes two entries the same toolset: what they say, ``${VAR}`` unread."""
    return json.dumps(entry.saved(), sort_keys=True)


async def open_entry(
    entry: ToolsetSpec,
    stack: AsyncExitStack,
    environ: Mapping[str, str],
    errlog: TextIO | None = None,
) -> list[Tool]:
    """Open what ``entry`` names (each toolset closed with ``stack``; a stdio server's stderr
    to ``errlog``): its tools. A failure is a :class:`UserInputError` whose message holds no
    value of its variables."""
    tools: list[Tool] = []
    try:
        for item in entry.toolset(environ, errlog):
            if isinstance(item, Toolset):
                tools += await stack.enter_async_context(item.open())
            else:
                tools.append(item)
    except HierplanError as exc:
        raise UserInputError(entry.hidden(str(exc), environ)) from None
    return tools


class SharedToolsets:
    """The servers that goals of one process share: each opened by the first goal that needs
    it, in a task of this object's own, and kept open until :meth:`close`. Run :meth:`serve`
    in a task group that outlives the goals (``await group.start(shared.serve)``)."""

    def __init__(self) -> None:
        self._tools: dict[str, list[Tool]] = {}
        # Made in serve, on the loop that holds the servers (a worker makes this object before
        # it has one).
        self._lock: anyio.Lock | None = None
        self._closed: anyio.Event | None = None
        self._group: TaskGroup | None = None

    async def serve(self, *, task_status: TaskStatus[None]) -> None:
        """Hold the shared servers until :meth:`close`."""
        self._lock, self._closed = anyio.Lock(), anyio.Event()
        async with anyio.create_task_group() as group:
            self._group = group
            task_status.started()
            await self._closed.wait()
            group.cancel_scope.cancel()

    def close(self) -> None:
        """Close every shared server (they close as :meth:`serve` returns)."""
        if self._closed is not None:
            self._closed.set()

    async def tools(self, entry: ToolsetSpec) -> list[Tool]:
        """The tools of ``entry``'s shared server, opened now if no goal opened it before."""
        if self._group is None or self._lock is None:
            raise RuntimeError("SharedToolsets.serve is not running")
        key = entry_key(entry)
        async with self._lock:
            found = self._tools.get(key)
            if found is None:
                found = await self._group.start(self._hold, entry)
                self._tools[key] = found
        return found

    async def _hold(self, entry: ToolsetSpec, *, task_status: TaskStatus[list[Tool]]) -> None:
        assert self._closed is not None
        async with AsyncExitStack() as stack:
            task_status.started(await open_entry(entry, stack, os.environ))
            await self._closed.wait()

    def borrow(self, entry: ToolsetSpec, label: str) -> Toolset:
        """A toolset that gives a run the shared server's tools (and leaves it open)."""
        return _Borrowed(self, entry, label)


class _Borrowed(Toolset):
    def __init__(self, shared: SharedToolsets, entry: ToolsetSpec, label: str) -> None:
        self.shared = shared
        self.entry = entry
        self.name = entry.label()
        self.label = label

    @asynccontextmanager
    async def open(self) -> AsyncIterator[Sequence[Tool]]:
        yield await self.shared.tools(self.entry)


def check_goal_toolsets(
    goals: Sequence[BatchGoal], entries_of: Mapping[str, Sequence[ToolsetSpec]], *, local: bool
) -> None:
    """Refuse a batch whose goals' toolsets cannot work (see the module's docstring), listing
    every problem with its line; ``entries_of`` gives each goal's entries by id."""
    problems: list[str] = []
    sound: list[BatchGoal] = []
    for goal in goals:
        # Each problem names its entry and the line (the entries are noted with their line).
        found = toolset_problems(entries_of[goal.id], os.environ, local=local)
        problems += found
        if not found and entries_of[goal.id]:
            sound.append(goal)
    if local and sound:
        # Each distinct entry opened once, in a thread of its own: this runs before the batch's
        # event loop does (or inside a caller's).
        with ThreadPoolExecutor(1) as pool:
            problems += pool.submit(anyio.run, _probe, sound, entries_of).result()
    if problems:
        shown = problems[:20]
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        raise UserInputError(
            f"{len(problems)} problem(s) with the goals' tools; nothing was started:\n  "
            + "\n  ".join(shown)
            + more
        )


async def _probe(
    goals: Sequence[BatchGoal], entries_of: Mapping[str, Sequence[ToolsetSpec]]
) -> list[str]:
    """Open each distinct entry once: what it gives, or why it cannot be used; then the
    problems of each goal, by line."""
    distinct = {entry_key(e): e for entries in entries_of.values() for e in entries}
    names: dict[str, list[str]] = {}
    failures: dict[str, str] = {}
    limiter = anyio.CapacityLimiter(PROBES_AT_ONCE)
    quiet = io.StringIO()  # the servers' chatter: the end of it is in a failure's message

    async def one(key: str, entry: ToolsetSpec) -> None:
        async with limiter, AsyncExitStack() as stack:
            try:
                opened = await open_entry(entry, stack, os.environ, quiet)
            except UserInputError as exc:
                failures[key] = str(exc)
            else:
                names[key] = [tool.name for tool in opened]

    async with anyio.create_task_group() as group:
        for key, entry in distinct.items():
            group.start_soon(one, key, entry)
    problems: list[str] = []
    for goal in goals:
        seen: dict[str, int] = {}
        clashes: dict[tuple[int, int], list[str]] = {}
        for index, entry in enumerate(entries_of[goal.id], 1):
            key = entry_key(entry)
            if key in failures:
                problems.append(f"{entry.named(index)}: {failures[key]}")
                continue
            for name in names.get(key, []):
                if name in seen and seen[name] != index:
                    clashes.setdefault((seen[name], index), []).append(name)
                seen.setdefault(name, index)
        problems += [
            f"line {goal.line}: tools entries {first} and {second} both have tools named "
            f"{', '.join(clashed)}; give one a tool_prefix"
            for (first, second), clashed in clashes.items()
        ]
    return problems


__all__ = ["SharedToolsets", "check_goal_toolsets", "entry_key", "open_entry"]
