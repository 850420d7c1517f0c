"""The built-in benchmark suites, by name."""

from __future__ import annotations

from hierplan.bench.base import Suite
from hierplan.errors import UserInputError


def suites() -> dict[str, Suite]:
    """Every built-in suite by name, in a stable order."""
    from hierplan.bench.suites.blocksworld import Blocksworld
    from hierplan.bench.suites.crafting import Crafting
    from hierplan.bench.suites.game24 import Game24
    from hierplan.bench.suites.parallel_qa import ParallelQA

    found: list[Suite] = [Blocksworld(), ParallelQA(), Crafting(), Game24()]
    return {s.name: s for s in found}


SUITE_NAMES: tuple[str, ...] = ("blocksworld", "parallel_qa", "crafting", "game24")


def get_suite(name: str) -> Suite:
    """The suite called ``name``; a clear error lists the known ones."""
    known = suites()
    try:
        return known[name]
    except KeyError:
        raise UserInputError(
            f"unknown suite {name!r}: choose one of {', '.join(SUITE_NAMES)} (or all)"
        ) from None


__all__ = ["SUITE_NAMES", "get_suite", "suites"]
