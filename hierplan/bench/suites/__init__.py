"""The benchmark suites by name: the built-in ones, and those installed packages register.

A package adds a suite with an entry point in the ``hierplan.suites`` group whose name is the
suite's name and whose object is its :class:`~hierplan.bench.base.Suite` subclass::

    [project.entry-points."hierplan.suites"]
    hanoi = "hierplan_example_suite:Hanoi"

A built-in name cannot be taken by a package: the built-in suite wins.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points

from hierplan.bench.base import Suite
from hierplan.errors import UserInputError

ENTRY_POINT_GROUP = "hierplan.suites"

SUITE_NAMES: tuple[str, ...] = (
    "blocksworld",
    "parallel_qa",
    "crafting",
    "game24",
    "planbench",
    "planbench_oneshot",
    "tot24",
)
"""The built-in suites, in the order tables list them."""


def _builtin() -> dict[str, type[Suite]]:
    from hierplan.bench.suites.blocksworld import Blocksworld
    from hierplan.bench.suites.crafting import Crafting
    from hierplan.bench.suites.game24 import Game24
    from hierplan.bench.suites.parallel_qa import ParallelQA
    from hierplan.bench.suites.planbench import PlanBench, PlanBenchOneShot
    from hierplan.bench.suites.tot24 import Tot24

    found = (Blocksworld, ParallelQA, Crafting, Game24, PlanBench, PlanBenchOneShot, Tot24)
    return {cls.name: cls for cls in found}


def registered() -> dict[str, EntryPoint]:
    """The suites installed packages register (built-in names left out), by name."""
    return {
        ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name not in SUITE_NAMES
    }


def suite_names() -> tuple[str, ...]:
    """Every installed suite: the built-in ones, then the registered ones by name."""
    return SUITE_NAMES + tuple(sorted(registered()))


def load_entry_point(ep: EntryPoint) -> type[Suite]:
    """The suite class an entry point names, checked (a clear error says what is wrong)."""
    where = f"the {ENTRY_POINT_GROUP} entry point {ep.name!r} ({ep.value})"
    try:
        loaded = ep.load()
    except Exception as exc:  # a broken package must not crash the benchmark with a traceback
        raise UserInputError(f"cannot load {where}: {type(exc).__name__}: {exc}") from None
    if not (isinstance(loaded, type) and issubclass(loaded, Suite)):
        raise UserInputError(f"{where} is not a hierplan.bench.Suite subclass")
    if getattr(loaded, "name", None) != ep.name:
        raise UserInputError(
            f"{where} names a suite called {getattr(loaded, 'name', None)!r}: the entry point's "
            "name must be the suite's name"
        )
    return loaded


def suite_class(name: str) -> type[Suite]:
    """The class of the suite called ``name``; a clear error lists the installed ones."""
    builtin = _builtin()
    if name in builtin:
        return builtin[name]
    ep = registered().get(name)
    if ep is None:
        raise UserInputError(
            f"unknown suite {name!r}: choose one of {', '.join(suite_names())} (or all)"
        )
    return load_entry_point(ep)


def get_suite(name: str, split: str | None = None) -> Suite:
    """The suite called ``name`` (on ``split``, for a suite with splits; a suite without
    splits ignores it)."""
    suite = suite_class(name)()
    if split is not None and suite.splits:
        if split not in suite.splits:
            raise UserInputError(
                f"{name} has no split {split!r}: choose one of {', '.join(suite.splits)}"
            )
        suite = suite.with_split(split)
    return suite


def suites() -> dict[str, Suite]:
    """Every installed suite by name, in a stable order (built-in ones first)."""
    return {name: get_suite(name) for name in suite_names()}


@dataclass(slots=True, frozen=True)
class Installed:
    """A suite or a strategy as ``hierplan bench --list`` shows it."""

    name: str
    origin: str
    description: str


def installed_suites() -> list[Installed]:
    """Every installed suite: its name, where it comes from, and what it is."""
    out = [Installed(n, "hierplan", c.description) for n, c in _builtin().items()]
    for name, ep in sorted(registered().items()):
        dist = ep.dist
        origin = f"{dist.name} {dist.version}" if dist is not None else ep.value
        try:
            description = load_entry_point(ep).description
        except UserInputError as exc:
            description = f"(cannot load: {exc})"
        out.append(Installed(name, origin, description))
    return out


__all__ = [
    "ENTRY_POINT_GROUP",
    "SUITE_NAMES",
    "Installed",
    "get_suite",
    "installed_suites",
    "registered",
    "suite_class",
    "suite_names",
    "suites",
]
