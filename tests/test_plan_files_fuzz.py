"""Fuzzing plan files through ``hierplan validate``, and goal files through their reader.

Whatever a file holds (JSON or YAML written with lone surrogates, as escapes or as bytes that
are not UTF-8; terminal control characters; thousands of steps and dependencies; nesting
thousands deep; bytes cut off or flipped) and whatever it is (a FIFO, a directory, a socket,
``/dev/zero``), the command ends with its output or one clear error, exit status 0, 1 or 2,
never a traceback, never waiting, and prints nothing a terminal would act on. The fast set runs
a few dozen examples of each; the slow set (``pytest -m slow``) 10,000.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from display_support import UNPRINTABLE
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from hierplan.cli import app
from hierplan.errors import UserInputError
from hierplan.runner.goals import load_goal_file

SLOW_EXAMPLES = 10_000
FAST = settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
SLOW = settings(
    max_examples=SLOW_EXAMPLES // 2, deadline=None, suppress_health_check=list(HealthCheck)
)
# Each long fuzzer runs as two items of half the examples, so that the slow set's two workers
# share it: a long fuzzer alone took one worker for most of an hour while the other sat idle.
HALVES = pytest.mark.parametrize("half", [1, 2])

# Any code point, with the ones a terminal acts on or cannot encode drawn often.
any_char = st.characters(exclude_categories=()) | st.sampled_from(
    ["\ud800", "\udfff", "\x1b", "\x9b", "\x07", "\x00", "\x7f", "\u202e", "\u2066", "\n"]
)
any_text = st.text(any_char, max_size=10) | st.sampled_from(
    ["\x1b[2J", "\x1b]0;owned\x07", "\x9b31m", "\ud800", "a", "b", "x"]
)


@st.composite
def plan_data(draw: st.DrawFn, most_steps: int) -> dict[str, Any]:
    """A plan's data: a few steps of any text, or (one time in four) up to ``most_steps``
    steps with up to 12 dependencies each, and arguments nested up to thousands deep. (Plans
    of many thousands of steps are fuzzed without the file and the command line, in
    ``test_plan_scale.py``.)"""
    many = draw(st.integers(0, 3)) == 0
    count = draw(st.integers(0, most_steps if many else 4))
    fan = draw(st.integers(0, 12 if many else 3))
    depth = draw(st.sampled_from([0, 1, 50, 900, 5_000]))
    text = draw(any_text)
    nested: Any = text
    for _ in range(depth):
        nested = [nested]
    steps = [
        {
            "id": f"s{i}" if many or draw(st.booleans()) else draw(any_text),
            "title": text,
            "instruction": text or "i",
            "depends_on": [f"s{(i * 7 + k) % max(count, 1)}" for k in range(fan)] + [text],
            "tool": "x",
            "args": {"q": nested},
        }
        for i in range(count)
    ]
    return {"goal": draw(any_text), "steps": steps, "rationale": text}


# A goal file's data: a goal of any text, with settings of any name and value.
goal_data = st.fixed_dictionaries(
    {"goal": any_text},
    optional={
        "strategy": any_text,
        "max_depth": st.integers(-5, 50) | any_text,
        "settings": st.dictionaries(any_text, any_text | st.integers() | st.floats(), max_size=3),
    },
)


@st.composite
def plan_files(draw: st.DrawFn, most_steps: int) -> bytes:
    """The bytes of a plan file: JSON or YAML of :func:`plan_data`, written every way a file
    may come (escaped, raw UTF-8, surrogates as the bytes Python would write for them), then
    perhaps cut off or with a byte changed; or any bytes at all."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=300))
    data = draw(plan_data(most_steps) | goal_data)
    form = draw(st.sampled_from(["json-ascii", "json-raw", "yaml"]))
    try:
        if form == "yaml":
            text = yaml.safe_dump(data, allow_unicode=draw(st.booleans()))
        else:
            text = json.dumps(data, ensure_ascii=form == "json-ascii")
    except (RecursionError, yaml.YAMLError):  # too deep for the writer: as JSON, by hand
        text = json.dumps({**data, "steps": []})[:-1] + ', "deep": ' + "[" * 5000 + "]" * 5000 + "}"
    content = text.encode("utf-8", "surrogatepass")
    if content and draw(st.integers(0, 4)) == 0:
        cut = draw(st.integers(0, len(content) - 1))
        if draw(st.booleans()):
            content = content[:cut]
        else:
            content = content[:cut] + bytes([draw(st.integers(0, 255))]) + content[cut + 1 :]
    return content


KINDS = ["regular"] * 6 + ["fifo", "directory", "socket", "symlink to a fifo", "/dev/zero"]


@pytest.fixture
def unix_socket(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "sock"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))
        yield path


def _file(kind: str, where: Path, suffix: str, content: bytes, unix_socket: Path) -> Path:
    path = where / f"plan{suffix}"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "socket":
        return unix_socket
    elif kind == "symlink to a fifo":
        os.mkfifo(where / "target")
        path.symlink_to(where / "target")
    elif kind == "/dev/zero":
        return Path(kind)
    else:
        path.write_bytes(content)
    return path


def _validated(kind: str, suffix: str, content: bytes, where: Path, unix_socket: Path) -> None:
    path = _file(kind, where, suffix, content, unix_socket)
    result = CliRunner().invoke(
        app, ["validate", str(path), "--tools", "x"], env={"COLUMNS": "120"}
    )
    output = result.output
    # A crash inside the command (an encoding error while printing, a recursion) is an
    # exception other than the exit the command chose.
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    assert result.exit_code in (0, 1, 2), (result.exit_code, output[-500:])
    assert "Traceback" not in output
    assert not UNPRINTABLE.search(output), repr(output[-500:])
    if kind != "regular":
        assert result.exit_code == 2, output
        assert "is not a regular file" in output or kind == "directory", output
    if result.exit_code == 2:
        assert output.startswith("error: "), output[:300]


def _goal_read(kind: str, suffix: str, content: bytes, where: Path, unix_socket: Path) -> None:
    path = _file(kind, where, suffix, content, unix_socket)
    try:
        load_goal_file(path)
    except UserInputError as exc:
        message = str(exc)
        assert not UNPRINTABLE.search(message.replace("\n", " ")), repr(message)
        if kind not in ("regular", "directory"):
            assert "is not a regular file" in message, message
        return
    assert kind == "regular"


def file_cases(most_steps: int) -> dict[str, st.SearchStrategy[Any]]:
    """A file of any kind, named for any format, holding any plan file's bytes."""
    return {
        "kind": st.sampled_from(KINDS),
        "suffix": st.sampled_from([".json", ".yaml", ".yml", ".txt", ""]),
        "content": plan_files(most_steps),
    }


FAST_CASES, SLOW_CASES = file_cases(100), file_cases(500)


@FAST
@given(**FAST_CASES)
def test_any_plan_file_is_validated_or_refused_in_one_printable_line(
    kind: str,
    suffix: str,
    content: bytes,
    tmp_path_factory: pytest.TempPathFactory,
    unix_socket: Path,
) -> None:
    _validated(kind, suffix, content, tmp_path_factory.mktemp("v"), unix_socket)


@pytest.mark.slow
@HALVES
@SLOW
@given(**SLOW_CASES)
def test_any_plan_file_is_validated_or_refused_in_one_printable_line_long(
    half: int,
    kind: str,
    suffix: str,
    content: bytes,
    tmp_path_factory: pytest.TempPathFactory,
    unix_socket: Path,
) -> None:
    _validated(kind, suffix, content, tmp_path_factory.mktemp("v"), unix_socket)


@FAST
@given(**FAST_CASES)
def test_any_goal_file_is_read_or_refused_with_a_printable_message(
    kind: str,
    suffix: str,
    content: bytes,
    tmp_path_factory: pytest.TempPathFactory,
    unix_socket: Path,
) -> None:
    _goal_read(kind, suffix, content, tmp_path_factory.mktemp("g"), unix_socket)


@pytest.mark.slow
@HALVES
@SLOW
@given(**SLOW_CASES)
def test_any_goal_file_is_read_or_refused_with_a_printable_message_long(
    half: int,
    kind: str,
    suffix: str,
    content: bytes,
    tmp_path_factory: pytest.TempPathFactory,
    unix_socket: Path,
) -> None:
    _goal_read(kind, suffix, content, tmp_path_factory.mktemp("g"), unix_socket)


# Found by the goal-file fuzzer: PyYAML turns a "\U" escape past any character into chr() of
# it, which raised OverflowError out of the reader.
BEYOND_UNICODE = b'goal: A\nsettings:\n  "0\\U00010000\\x1F\\UA0010000": 1\n'


def test_an_escape_past_any_character_is_refused_in_a_goal_file(tmp_path: Path) -> None:
    path = tmp_path / "goal.yaml"
    path.write_bytes(BEYOND_UNICODE)
    with pytest.raises(UserInputError, match="invalid Unicode character escape code"):
        load_goal_file(path)


def test_an_escape_past_any_character_is_refused_in_a_plan_file(tmp_path: Path) -> None:
    path = tmp_path / "plan.yaml"
    path.write_bytes(b'goal: g\nsteps:\n  - id: "\\UA0010000"\n')
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    assert "invalid Unicode character escape code" in result.output
    assert "Traceback" not in result.output


# Found while timing the goal-file fuzzer: a goal file was read a second time, by PyYAML's
# composer in Python, for the lines of its tools list; data nested 900 deep, which the first
# reading takes, raised RecursionError out of the reader. (Hypothesis raises the recursion limit
# while it runs a test, so the fuzzer itself never met it.)
@pytest.mark.parametrize("tools", [False, True], ids=["without-tools", "with-tools"])
def test_a_goal_file_nested_deep_is_refused_with_a_message(tmp_path: Path, tools: bool) -> None:
    path = tmp_path / "goal.json"
    listed = '"tools": [{"ssh": 1}], ' if tools else ""
    path.write_text('{"goal": "g", ' + listed + '"max_depth": ' + "[" * 900 + "]" * 900 + "}")
    with pytest.raises(UserInputError) as refused:
        load_goal_file(path)
    assert "max_depth" in str(refused.value)
    if tools:
        assert "line 1: tools entry 1: unknown kind 'ssh'" in str(refused.value)
