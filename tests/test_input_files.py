"""Plan, goal and goals files that are not regular files (a FIFO, a device, a directory) are
refused at once, never read forever or waited on; a goals file is read a line at a time, with
a size limit."""

from __future__ import annotations

import hashlib
import os
import resource
import socket
import subprocess
import sys
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hierplan.batch import goals as goals_module
from hierplan.batch.goals import goals_digest, load_goals
from hierplan.errors import UserInputError
from hierplan.files import read_text_file
from hierplan.records import RunResult

SCENARIO_LINE = b'{"scenario": "data_migration"}\n'


def _limited() -> None:
    """In the child: at most 3 GiB of memory, so that a file read without end fails fast."""
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))


def hierplan(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The command, with a bound on its memory and time: were it to read a device without end
    or wait on a FIFO forever, the test would fail, not the machine."""
    return subprocess.run(
        [sys.executable, "-m", "hierplan", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_limited,
        env={**os.environ, "COLUMNS": "300"},
        check=False,
    )


@pytest.mark.parametrize(
    "command",
    [["validate"], ["run", "--goal-file"], ["batch", "--out", "out", "--goals"]],
    ids=["plan file", "goal file", "goals file"],
)
@pytest.mark.parametrize("kind", ["fifo", "/dev/zero"])
def test_a_file_that_is_not_regular_is_refused_at_once(
    command: list[str], kind: str, tmp_path: Path
) -> None:
    if kind == "fifo":
        path = tmp_path / "pipe"
        os.mkfifo(path)  # no writer: opening it to read would wait forever
    else:
        path = Path(kind)  # reading it would never end
    args = [a for a in command if a != "--goals"] + [str(path)]
    done = hierplan(*args, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert f"{path} is not a regular file" in " ".join(done.stderr.split())
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1


def test_a_goals_file_larger_than_the_limit_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "goals.jsonl"
    with path.open("wb") as out:
        out.truncate(17 * 1024 * 1024)  # sparse: 17 MiB of zeros on no disk space
    done = hierplan("batch", str(path), "--out", "out", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert f"goals file {path} is larger than 16,777,216 bytes" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_goals_file_is_read_a_line_at_a_time(tmp_path: Path) -> None:
    """A line of megabytes is refused without being held whole; the lines after it are read."""
    path = tmp_path / "goals.jsonl"
    path.write_bytes(b"x" * 6_000_000 + b"\n" + SCENARIO_LINE)
    tracemalloc.start()
    try:
        with pytest.raises(UserInputError) as caught:
            load_goals(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "1 invalid line(s)" in str(caught.value)
    assert "line 1: longer than 210,000 characters" in str(caught.value)
    assert peak < 4_000_000, peak  # a line's worth of bytes at a time, not the file


def test_a_goals_file_keeps_its_digest_and_its_lines(tmp_path: Path) -> None:
    """Read a line at a time, the file has the digest of its bytes (a batch resumes only with
    the same file); a byte-order mark, CRLF line ends and a last line without one are read."""
    path = tmp_path / "goals.jsonl"
    crlf = SCENARIO_LINE.replace(b"\n", b"\r\n")
    path.write_bytes(b"\xef\xbb\xbf" + crlf + b"\n" + b'{"id": "x", "scenario": "data_migration"}')
    loaded = load_goals(path)
    assert [(g.id, g.line) for g in loaded.goals] == [("line-1", 1), ("x", 3)]
    assert loaded.digest == goals_digest(path) == hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_goals_file_that_is_not_utf8_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "goals.jsonl"
    path.write_bytes(SCENARIO_LINE + b'{"goal": "caf\xe9"}\n')
    with pytest.raises(UserInputError, match=r"is not UTF-8 text \(line 2"):
        load_goals(path)


def test_the_goals_file_limit_counts_every_byte_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(goals_module, "MAX_TEXT_FILE_BYTES", 100)
    path = tmp_path / "goals.jsonl"
    path.write_bytes(SCENARIO_LINE * 3)  # 93 bytes
    assert len(load_goals(path).goals) == 3
    path.write_bytes(SCENARIO_LINE * 4)
    with pytest.raises(UserInputError, match="is larger than 100 bytes"):
        load_goals(path)


# -- fuzzing: files of every kind ----------------------------------------------------------

READERS: dict[str, Callable[[Path], Any]] = {
    "plan or goal file": lambda path: read_text_file(path, "plan file"),
    "goals file": load_goals,
    "goals digest": goals_digest,
    "run record": RunResult.load,
}


@pytest.fixture
def unix_socket(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "sock"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))
        yield path


def _make(kind: str, where: Path, content: bytes, unix_socket: Path) -> Path:
    path = where / f"{kind}-{len(list(where.iterdir()))}"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "socket":
        return unix_socket
    elif kind == "symlink to a fifo":
        os.mkfifo(where / f"target-{path.name}")
        path.symlink_to(where / f"target-{path.name}")
    elif kind in ("/dev/null", "/dev/zero"):
        return Path(kind)
    else:
        path.write_bytes(content)
    return path


KINDS = ["regular", "fifo", "directory", "socket", "symlink to a fifo", "/dev/null", "/dev/zero"]


def _read_any(kind: str, reader: str, content: bytes, where: Path, unix_socket: Path) -> None:
    path = _make(kind, where, content, unix_socket)
    try:
        READERS[reader](path)
    except UserInputError as exc:
        message = str(exc)
        assert "\n" not in message or reader == "goals file", message
        if kind not in ("regular", "directory"):
            assert "is not a regular file" in message, message
        return
    assert kind == "regular"


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    kind=st.sampled_from(KINDS),
    reader=st.sampled_from(sorted(READERS)),
    content=st.binary(max_size=200) | st.just(SCENARIO_LINE),
)
def test_any_file_is_read_or_refused_never_waited_on(
    kind: str,
    reader: str,
    content: bytes,
    tmp_path_factory: pytest.TempPathFactory,
    unix_socket: Path,
) -> None:
    _read_any(kind, reader, content, tmp_path_factory.mktemp("f"), unix_socket)


@pytest.mark.slow
@settings(max_examples=10_000, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    kind=st.sampled_from(KINDS),
    reader=st.sampled_from(sorted(READERS)),
    content=st.binary(max_size=200) | st.just(SCENARIO_LINE),
)
def test_any_file_is_read_or_refused_never_waited_on_long(
    kind: str,
    reader: str,
    content: bytes,
    tmp_path_factory: pytest.TempPathFactory,
    unix_socket: Path,
) -> None:
    _read_any(kind, reader, content, tmp_path_factory.mktemp("f"), unix_socket)
