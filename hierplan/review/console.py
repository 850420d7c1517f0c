"""The console reviewer: approve, edit in ``$EDITOR``, reject with a reason, or quit.

Each review shows the plan as a tree (waves of parallel steps, dependencies, tools, each
sub-goal's budget estimate) and, for a replan or a new proposal after a rejection, what changed.
An edit opens the plan as YAML in ``$VISUAL`` or ``$EDITOR``; the edited plan is validated again
and refused with the validators' findings until it is valid, discarded, or the reviewer quits.
A rejection asks for a reason, which goes to the planner. Quitting pauses the run: this plan and
every later one are deferred for ``hierplan resume``.

Sub-goals can reach the gate at the same time; their reviews are asked one at a time (an
:class:`anyio.Lock`), and none is lost. The questions run in a daemon thread, so that the rest
of the run goes on meanwhile and an interrupt does not wait for an answer.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shlex
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from types import MappingProxyType
from typing import Protocol, TextIO, TypeVar, cast

import anyio
import anyio.from_thread
import anyio.lowlevel
from rich.console import Console
from rich.prompt import Prompt
from rich.text import Text

from hierplan.errors import UserInputError
from hierplan.files import DataTextError, parse_data_text
from hierplan.hierarchy.gate import GateContext, in_daemon_thread
from hierplan.plans.decisions import Approve, Decision, Defer, Edit, Reject
from hierplan.plans.plan import Plan, plan_from_data, plan_to_yaml
from hierplan.review.render import diff_view, plan_review_tree, review_view, tool_hints
from hierplan.view.tree import plain

T = TypeVar("T")

# Read-only: shared by every review.
MAIN_CHOICES: Mapping[str, str] = MappingProxyType(
    {"a": "approve", "e": "edit", "r": "reject", "q": "quit"}
)
EDITED_CHOICES: Mapping[str, str] = {
    "a": "approve the edited plan",
    "e": "edit again",
    "d": "discard the edit",
    "r": "reject",
    "q": "quit",
}
EDITED_CHOICES = MappingProxyType(EDITED_CHOICES)
REFUSED_CHOICES: Mapping[str, str] = MappingProxyType(
    {"e": "edit again (your changes are kept)", "d": "discard the edit", "q": "quit"}
)
QUIT_NOTE = "quit at the console; decide with hierplan resume"


# How long after a plan editor closes a Ctrl-C is still taken as the editor's: the signal reaches
# the editor and this process together, and an editor that exits on it may be gone before the
# run looks at the signal.
EDITOR_GRACE_S = 0.5


class _EditorWatch:
    """Whether a plan editor runs in this process, or closed a moment ago."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open = 0
        self._closed_at = float("-inf")

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Mark an editor as running for the duration of the block."""
        with self._lock:
            self._open += 1
        try:
            yield
        finally:
            with self._lock:
                self._open -= 1
                self._closed_at = time.monotonic()

    def active(self) -> bool:
        """Whether an editor runs now or closed less than :data:`EDITOR_GRACE_S` ago."""
        with self._lock:
            return self._open > 0 or time.monotonic() - self._closed_at < EDITOR_GRACE_S


_EDITORS = _EditorWatch()


def editor_open() -> bool:
    """Whether a plan is open in an editor in this process (or was a moment ago).

    A Ctrl-C typed then is meant for the editor (vi leaves insert mode with it), not to stop
    the run: the terminal sends it to the editor and to this process alike.
    """
    return _EDITORS.active()


class Suspendable(Protocol):
    """A live display that must stand aside while a question is asked (e.g. a progress bar)."""

    def suspended(self) -> AbstractContextManager[None]:
        """Stop drawing (and hold back output) until the context exits."""
        ...


def reviewer_name() -> str:
    """Who reviews at this terminal, for the audit trail."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


class ConsoleReviewer:
    """Reviews plans at the terminal; see the module docstring.

    ``editor`` overrides ``$VISUAL``/``$EDITOR``; ``display`` is suspended during a review;
    ``stream`` reads answers from a file instead of the terminal (for tests and scripts).
    """

    def __init__(
        self,
        console: Console,
        *,
        editor: str | None = None,
        display: Suspendable | None = None,
        stream: TextIO | None = None,
        who: str | None = None,
    ) -> None:
        self.console = console
        self.editor = editor
        self.display = display
        self.stream = None if stream is None else cast(TextIO, _UntilEnd(stream))
        self.by = f"console:{who or reviewer_name()}"
        self.lock = anyio.Lock()
        self.quitting = False
        self._rejected: dict[str, str] = {}

    async def review(self, plan: Plan, ctx: GateContext) -> Decision:
        """Ask the person at the console, after any review already on screen."""
        async with self.lock:
            if self.quitting:
                return Defer(by=self.by, note=QUIT_NOTE)
            suspended = self.display.suspended() if self.display else contextlib.nullcontext()
            # A retry answers this reviewer's rejection; a replan answers a failure.
            rejected = self._rejected.get(ctx.path) if ctx.reason == "retry" else None
            with suspended:
                session = _Session(self, plan, ctx, rejected)
                decision = await in_daemon_thread(session.run)
            if isinstance(decision, Reject):
                self._rejected[ctx.path] = decision.reason
            elif isinstance(decision, Defer):
                self.quitting = True
            else:
                self._rejected.pop(ctx.path, None)
            return decision

    def ask(self, choices: Mapping[str, str]) -> str:
        """One of ``choices`` (by its letter), asked until the answer is one of them."""
        legend = Text("  ")
        for key, meaning in choices.items():
            legend.append(key, style="bold cyan")
            legend.append(f" {meaning}   ")
        self.console.print(legend)
        prompt = Text(f"Decision [{'/'.join(choices)}]")
        return Prompt.ask(
            prompt,
            console=self.console,
            choices=list(choices),
            show_choices=False,
            case_sensitive=False,
            stream=self.stream,
        ).lower()

    def ask_reason(self) -> str:
        """A non-empty reason for a rejection."""
        while True:
            reason = Prompt.ask(
                Text("Why reject it? (the planner gets this)"),
                console=self.console,
                stream=self.stream,
            ).strip()
            if reason:
                return reason
            self.console.print("A reason is needed: the planner uses it for the next plan.")

    def editor_command(self) -> list[str]:
        """The editor to run, from ``editor``, ``$VISUAL``, ``$EDITOR``, else ``vi``; empty
        when the setting cannot be read as a command (an unclosed quote, only spaces)."""
        chosen = self.editor or os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
        try:
            return shlex.split(chosen)
        except ValueError:
            return []


class _UntilEnd:
    """A stream of answers that raises :class:`EOFError` at its end, as a terminal does."""

    def __init__(self, inner: TextIO) -> None:
        self.inner = inner

    def readline(self) -> str:
        """The next line; ``EOFError`` when there is none."""
        line = self.inner.readline()
        if not line:
            raise EOFError
        return line


class _Session:
    """One review of one plan (runs in a worker thread; blocking I/O is fine here)."""

    def __init__(
        self, reviewer: ConsoleReviewer, plan: Plan, ctx: GateContext, rejected: str | None
    ) -> None:
        self.reviewer = reviewer
        self.console = reviewer.console
        self.plan = plan
        self.ctx = ctx
        self.rejected = rejected
        self.current = plan
        self.text: str | None = None
        # The last refused edit: the next edit starts from it until it is discarded or fixed,
        # even when an editor run in between fails.
        self.draft: str | None = None

    def run(self) -> Decision:
        """Show the plan and ask until there is a decision; closed input pauses the run."""
        try:
            return self._run()
        except EOFError:
            self.console.print("\nInput closed: pausing for hierplan resume.")
            return Defer(by=self.reviewer.by, note="input closed at the console")

    def _run(self) -> Decision:
        self.console.rule(Text(f"plan review: node {self.ctx.path}", style="bold"))
        self.console.print(review_view(self.plan, self.ctx, rejected=self.rejected))
        by = self.reviewer.by
        while True:
            edited = self.current is not self.plan
            choice = self.reviewer.ask(EDITED_CHOICES if edited else MAIN_CHOICES)
            if choice == "a":
                if edited:
                    return Edit(self.current, by=by, note="edited at the console")
                return Approve(by=by)
            if choice == "r":
                return Reject(self.reviewer.ask_reason(), by=by)
            if choice == "q":
                self.console.print(
                    "Pausing: nothing new starts, running steps finish, and the plan is saved "
                    "for hierplan resume."
                )
                return Defer(by=by, note=QUIT_NOTE)
            if choice == "d":
                self.current, self.text, self.draft = self.plan, None, None
                self.console.print("Edit discarded; back to the proposed plan.")
                continue
            if not self._edit():
                return Defer(by=by, note=QUIT_NOTE)

    def _edit(self) -> bool:
        """Edit until valid, discarded or quit; False means quit."""
        text = self.draft or self.text or self._yaml_for_editing(self.current)
        while True:
            new_text = self._run_editor(text)
            if new_text is None:
                if self.draft is not None:
                    self.console.print("The refused edit is kept for your next edit.")
                return True
            if not _without_comments(new_text):
                self.console.print("The file was empty: edit cancelled.")
                self.draft = None
                return True
            plan, problems = self._check(new_text)
            if plan is not None and not problems:
                self.draft = None
                if plan == self.current:
                    self.console.print("No change to the plan.")
                    return True
                self.current, self.text = plan, new_text
                self.console.print(Text("Edited plan is valid.", style="green"))
                hints = tool_hints(self.ctx)
                self.console.print(diff_view(self.plan, plan, hints=hints))
                self.console.print(plan_review_tree(plan, title="edited plan", hints=hints))
                return True
            self.console.print(Text("The edited plan was refused:", style="bold red"))
            for problem in problems:
                self.console.print(Text(f"  - {plain(problem)}", style="red"))
            self.draft = new_text
            choice = self.reviewer.ask(REFUSED_CHOICES)
            if choice == "q":
                return False
            if choice == "d":
                self.draft = None
                self.console.print("Edit discarded.")
                return True
            text = new_text

    def _check(self, text: str) -> tuple[Plan | None, list[str]]:
        # Read as strictly as a plan file: an edit is as untrusted as one, and nesting too deep
        # or a number too long must be a finding here, not an error that ends the review.
        try:
            data = parse_data_text(text)
        except DataTextError as exc:
            return None, [f"the edited plan {exc}"]
        try:
            plan = plan_from_data(data, source="the edited plan")
        except UserInputError as exc:
            return None, [str(exc)]
        return plan, [str(p) for p in self.ctx.validate(plan, by=self.reviewer.by)]

    def _yaml_for_editing(self, plan: Plan) -> str:
        tools = ", ".join(sorted(self.ctx.allowed_tools)) or "none"
        head = [
            f"Plan for node {self.ctx.path} (version {self.ctx.version}). Edit it, save and "
            "close the editor.",
            f"Tools allowed here: {tools}",
            "A step: id, title, instruction, depends_on [ids], kind (task | subgoal), "
            "tool and args.",
            "Save an empty file to cancel the edit.",
        ]
        return "".join(f"# {line}\n" for line in head) + plan_to_yaml(plan)

    def _run_editor(self, text: str) -> str | None:
        command = self.reviewer.editor_command()
        if not command:
            self.console.print(
                "Cannot read the editor command from $VISUAL / $EDITOR: set it to your editor "
                "(the edit is discarded).",
                markup=False,
            )
            return None
        fd, name = tempfile.mkstemp(prefix=f"hierplan-plan-{self.ctx.path}-", suffix=".yaml")
        path = Path(name)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
            try:
                with _EDITORS.running():
                    done = subprocess.run([*command, str(path)], check=False)
            except OSError as exc:
                self.console.print(
                    f"Cannot start the editor {command[0]!r} ({exc.strerror or exc}): set "
                    "$EDITOR to your editor.",
                    markup=False,
                )
                return None
            if done.returncode != 0:
                self.console.print(
                    f"The editor exited with status {done.returncode}: what it saved is not used."
                )
                return None
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            self.console.print(f"Cannot read the edited plan: {exc}", markup=False)
            return None
        finally:
            path.unlink(missing_ok=True)


def _without_comments(text: str) -> str:
    return "\n".join(
        line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")
    )
