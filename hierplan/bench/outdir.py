"""A benchmark's directory: ``bench.json`` (what a resume must match), ``results.jsonl`` (one
record a run, appended as each run ends) and, with ``--save-runs``, each run's ``run.json``.

``bench.json`` holds the benchmark's identity: the model and its price, the simulator's profile
with every knob, the latency scale, the task seed and split, the depth, ``--set``, and the code
(hierplan's version, the commit, whether the package's source differed from it). A resume with
anything else is refused, naming each difference, so that one table never mixes the runs of two
commits or two settings.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from hierplan.errors import UserInputError
from hierplan.files import make_directory, write_atomic
from hierplan.redact import redact_data

RESULTS = "results.jsonl"
MANIFEST = "bench.json"
RUNS_DIR = "runs"


def load_results(path: Path) -> list[dict[str, Any]]:
    """The records of a ``results.jsonl`` (a torn last line, from an interruption, is skipped)."""
    records = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise UserInputError(f"cannot read {path}: {exc.strerror or exc}") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines):
                break
            raise UserInputError(f"{path} line {number} is not JSON") from None
    return records


def check_new(out: Path) -> None:
    """``out`` holds no benchmark yet (one there is never overwritten)."""
    results = out / RESULTS
    if results.exists():
        raise UserInputError(
            f"{results} already exists: pass --resume to continue that benchmark, or choose "
            "another --out"
        )


def start_new(out: Path, identity: Mapping[str, Any]) -> None:
    """Make ``out`` and write its ``bench.json``."""
    make_directory(out, "the benchmark directory")
    write_atomic(out / MANIFEST, json.dumps(identity, indent=1))


def read_for_resume(out: Path, identity: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The records of the benchmark in ``out``, if it was made with ``identity`` (else a
    one-line refusal naming every difference)."""
    results = out / RESULTS
    manifest = out / MANIFEST
    if not results.exists():
        raise UserInputError(f"nothing to resume: {results} does not exist")
    try:
        # Redacted as the identity is now: a file written before it redacted still matches.
        before = redact_data(json.loads(manifest.read_text(encoding="utf-8")))
    except (OSError, json.JSONDecodeError):
        raise UserInputError(f"cannot resume: {manifest} is missing or unreadable") from None
    now = json.loads(json.dumps(identity))
    if before != now:
        differences = "; ".join(identity_differences(before, now))
        raise UserInputError(
            f"cannot resume {out}: it was made with other settings ({differences}); use the "
            "same ones (and the same code) or another --out"
        )
    return load_results(results)


# The flag (or what else) that sets each part of a benchmark's identity.
IDENTITY_FLAGS: Mapping[str, str] = MappingProxyType(
    {
        "model": "--model",
        "profile": "--sim-profile",
        "latency_scale": "--sim-latency-scale",
        "task_seed": "--task-seed",
        "split": "--split",
        "max_depth": "--max-depth",
        "base_url": "--base-url",
        "run_settings": "--set",
        "tools": "--tools/--mcp",
        "price": "the model's price (--price-in, --price-out)",
        "code": "the code's",
    }
)


def identity_differences(before: Any, now: dict[str, Any]) -> list[str]:
    """Each setting in which ``now`` differs from the recorded identity ``before``, named by
    its flag (and, within a part with fields, by its field), with the value recorded and the
    value given."""
    if not isinstance(before, dict):
        return [f"{MANIFEST} holds no settings"]
    found: list[str] = []
    for key in dict.fromkeys([*before, *now]):
        was, given = before.get(key), now.get(key)
        if was == given:
            continue
        flag = IDENTITY_FLAGS.get(key, key)
        if isinstance(was, dict) and isinstance(given, dict):
            for field_name in dict.fromkeys([*was, *given]):
                if was.get(field_name) != given.get(field_name):
                    recorded, asked = _shown(was.get(field_name)), _shown(given.get(field_name))
                    found.append(f"{flag} {field_name}: {recorded} then, {asked} now")
        else:
            found.append(f"{flag}: {_shown(was)} then, {_shown(given)} now")
    return found


def _shown(value: Any) -> str:
    """A recorded value as it reads in a message (``not given`` for none)."""
    return "not given" if value is None or value == {} else json.dumps(value)


def end_with_a_whole_line(results: Path) -> None:
    """Make ``results`` end with a newline before records are appended to it: a last line an
    interruption left without one is completed if it is a whole record (it was loaded), else
    cut off (it was skipped), so that the next record starts a line of its own."""
    with results.open("rb+") as handle:
        data = handle.read()
        if not data or data.endswith(b"\n"):
            return
        cut = data.rfind(b"\n") + 1
        try:
            json.loads(data[cut:])
        except ValueError:
            handle.truncate(cut)
        else:
            handle.write(b"\n")


def save_run(out: Path, run_id: str, text: str) -> str:
    """Write a run's ``run.json`` under ``out/runs/<run id>/``; returns its path in ``out``."""
    relative = Path(RUNS_DIR) / run_id / "run.json"
    target = out / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(target, text)
    return relative.as_posix()
