"""The findings of plan validation (:func:`hierplan.plans.plan.validate_plan`): each
:class:`PlanProblem`, the capped list they are gathered in, and how their messages quote what a
plan holds (any text, at any length, in any number)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from hierplan.text import printable


@dataclass(slots=True, frozen=True)
class PlanProblem:
    """One validation finding: a code, the step it concerns (if any) and a message."""

    code: str
    message: str
    step: str | None = None

    def __str__(self) -> str:
        # Messages quote plan content with repr(), which escapes what a terminal would act on;
        # a validator of someone else's may not: what is printed is printable either way.
        return printable(self.message)


MAX_PROBLEMS = 100
"""The most problems :func:`~hierplan.plans.plan.validate_plan` lists; a last one says how many
more it found."""


class ProblemList:
    """The problems found so far: the first ``limit`` kept, the others only counted, so that
    a plan of millions of bad dependencies costs neither the memory of millions of messages
    nor the minutes of printing them."""

    __slots__ = ("kept", "limit", "more")

    def __init__(self, limit: int) -> None:
        self.kept: list[PlanProblem] = []
        self.limit = limit
        self.more = 0

    @property
    def full(self) -> bool:
        """Whether a problem found now is only counted (its message is not even made)."""
        return len(self.kept) >= self.limit

    def add(self, problem: PlanProblem) -> None:
        """Keep ``problem``, or count it when the list is full."""
        if self.full:
            self.more += 1
        else:
            self.kept.append(problem)

    def extend(self, problems: Iterable[PlanProblem]) -> None:
        """:meth:`add` each of ``problems``."""
        for problem in problems:
            self.add(problem)

    def listed(self) -> list[PlanProblem]:
        """The problems kept, and one saying how many more were found, if any."""
        if not self.more:
            return self.kept
        more = PlanProblem(
            "more_problems",
            f"and {self.more:,} more problems: fix these, then validate the plan again",
        )
        return [*self.kept, more]


def names_text(names: Sequence[str], limit: int = 20) -> str:
    """``names`` joined by ``, ``, at most ``limit`` of them and how many more."""
    shown = ", ".join(names[:limit])
    more = len(names) - limit
    return f"{shown} and {more:,} more" if more > 0 else shown


def quoted(text: str, limit: int = 80) -> str:
    """``text`` quoted as ``repr`` quotes it (what a terminal would act on escaped), cut to
    about ``limit`` characters: a dependency is any string, of any length."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text):,} characters)"


def chain_text(path: Sequence[str], ends: int = 10) -> str:
    """A cycle's step ids joined by arrows; one of thousands of steps is shown by its first
    and last ``ends`` steps and how many are between."""
    if len(path) <= 2 * ends + 1:
        return " -> ".join(path)
    between = len(path) - 2 * ends
    return f"{' -> '.join(path[:ends])} -> ... ({between:,} more) -> {' -> '.join(path[-ends:])}"
