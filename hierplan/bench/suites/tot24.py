"""Tree of Thoughts' Game of 24: the 1,362 puzzles of ``24.csv``, ranked by human solving time.

The puzzles, their ranks and the paper's test split (ranks 901 to 1,000, the 100 hard puzzles
the paper reports on) come from the Tree of Thoughts repository, shipped with its MIT licence
in ``hierplan/bench/data/tot_game24/`` (``SOURCE.md`` there names the commit). Tools, oracle
and the exact checker are those of ``game24``: only the puzzles and their names differ. A task
is named as the set names it: its rank and its four numbers, in the order of the file.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from functools import cache
from importlib import resources

from hierplan.bench.base import BenchTask, Published, Suite, TaskEnv, public_selection
from hierplan.bench.suites.game24 import Game24Oracle, PoolEnv, Puzzle, task_text

TEST_RANKS = range(901, 1001)
"""The paper's test split: the puzzles ranked 901 to 1,000."""

SOURCE = (
    "Tree of Thoughts (Yao et al., NeurIPS 2023), github.com/princeton-nlp/tree-of-thought-llm "
    "at ab40034, src/tot/data/24/24.csv; MIT licence"
)

_TEST = "the test split: the 100 puzzles ranked 901-1,000"
PUBLISHED: tuple[Published, ...] = tuple(
    Published(
        model="GPT-4",
        method=method,
        success=success,
        setting=setting,
        tasks=_TEST,
        source="Yao et al. 2023 (Tree of Thoughts)",
        suite=None,  # measured without tools: no suite here runs in that setting
        split="test",
    )
    for method, success, setting in (
        ("IO prompting", 0.073, "answer written at once, few-shot prompt, no tools"),
        ("chain of thought", 0.04, "reasoning then answer, few-shot prompt, no tools"),
        ("CoT self-consistency (k=100)", 0.09, "majority of 100 chains of thought, no tools"),
        ("Tree of Thoughts (breadth 1)", 0.45, "search over thoughts with self-evaluation"),
        ("Tree of Thoughts (breadth 5)", 0.74, "search over thoughts with self-evaluation"),
    )
)


@dataclass(slots=True, frozen=True)
class RankedPuzzle:
    """A puzzle of ``24.csv``: its rank, its numbers as written, and how people fared."""

    rank: int
    numbers: tuple[int, ...]
    solved_rate: str
    human_seconds: float

    @property
    def name(self) -> str:
        """``"4 5 6 10 (rank 901)"``: how the set names it."""
        return f"{' '.join(map(str, self.numbers))} (rank {self.rank})"


def data_file(name: str) -> str:
    """The text of a file of the shipped Game of 24 set."""
    return (resources.files("hierplan.bench") / "data" / "tot_game24" / name).read_text("utf-8")


@cache
def load_puzzles() -> tuple[RankedPuzzle, ...]:
    """Every puzzle of ``24.csv``, by rank."""
    rows = csv.DictReader(io.StringIO(data_file("24.csv")))
    puzzles = [
        RankedPuzzle(
            rank=int(row["Rank"]),
            numbers=tuple(int(n) for n in row["Puzzles"].split()),
            solved_rate=row["Solved rate"],
            human_seconds=float(row["AMT (s)"]),
        )
        for row in rows
    ]
    return tuple(sorted(puzzles, key=lambda p: p.rank))


def split_puzzles(split: str) -> tuple[RankedPuzzle, ...]:
    """The puzzles of ``split`` (``test``: ranks 901-1,000; ``all``: every one), by rank."""
    puzzles = load_puzzles()
    if split == "all":
        return puzzles
    if split == "test":
        return tuple(p for p in puzzles if p.rank in TEST_RANKS)
    raise ValueError(f"tot24 has no split {split!r}: choose test or all")


class Tot24(Suite):
    """Tree of Thoughts' Game of 24 puzzles, the test split (ranks 901-1,000) by default."""

    name = "tot24"
    description = (
        "public: Tree of Thoughts' Game of 24, 1,362 ranked puzzles; test split = ranks "
        "901-1,000 (default), or all; exact rational checker"
    )
    source = SOURCE
    splits = ("test", "all")
    published = PUBLISHED

    def __init__(self, split: str = "test") -> None:
        split_puzzles(split)  # a clear error for an unknown split
        self._split = split

    @property
    def split(self) -> str:
        """The split the tasks come from."""
        return self._split

    def with_split(self, split: str) -> Tot24:
        """The suite on ``split`` (``test`` or ``all``)."""
        return Tot24(split)

    def size(self) -> int:
        """Puzzles in the split."""
        return len(split_puzzles(self._split))

    def generate(self, count: int, seed: int = 0) -> list[BenchTask]:
        """The split's first ``count`` puzzles by rank (seed 0), or a sample of them."""
        chosen = public_selection(split_puzzles(self._split), count, seed, f"tot24:{self._split}")
        return [
            self.task(
                seed,
                index,
                task_text(p.numbers, f"Tree of Thoughts rank {p.rank}"),
                {"rank": p.rank, "numbers": " ".join(map(str, p.numbers)), "split": self._split},
                Puzzle(p.numbers),
                name=p.name,
            )
            for index, p in enumerate(chosen)
        ]

    def environment(self, task: BenchTask, *, latency_scale: float = 1.0) -> TaskEnv:
        """A fresh pool; the verifier checks the expression left in it."""
        puzzle: Puzzle = task.data
        env = PoolEnv(puzzle.numbers)
        return TaskEnv(goal=task.goal, tools=env.tools(), verify=lambda _answer: env.verify())

    def oracle(self) -> Game24Oracle:
        """The Game of 24 oracle: a solver that finds a way to 24 from any pool."""
        return Game24Oracle()
