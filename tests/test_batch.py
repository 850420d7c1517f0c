"""Batch runs: goals files, one global budget, the journal, resume after SIGKILL, the CLI."""

from __future__ import annotations

import hashlib
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from batch_support import PRICED_AS, config, load_benchmark, text_goals
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from hierplan import RunResult
from hierplan.batch import BatchBudget, BatchConfig, RunOptions, parse_goals, run_batch
from hierplan.batch.budget import decide
from hierplan.batch.goals import BatchGoal, goal_seed, load_goals
from hierplan.batch.journal import Journal, open_journal
from hierplan.bench.suites import get_suite
from hierplan.budgets.budget import Fixed
from hierplan.budgets.instrument import DEFAULT_MIN_OUTPUT_FRACTION
from hierplan.cli import app
from hierplan.core.settings import RunSettings
from hierplan.errors import UserInputError
from hierplan.units import pico_to_usd, usd_to_pico

HERE = Path(__file__).resolve().parent


# -- goals files ---------------------------------------------------------------------------


def test_a_malformed_goals_file_is_refused_with_line_numbers(tmp_path: Path) -> None:
    goals = tmp_path / "goals.jsonl"
    goals.write_text(
        '{"scenario": "data_migration"}\n'
        "\n"
        '{"scenario": "nowhere"}\n'
        "{not json\n"
        '{"goal": "free text", "strategy": "zigzag"}\n'
        '["a list"]\n'
        '{"scenario": "data_migration", "id": "line-1"}\n'
        '{"scenario": "data_migration", "seed": true}\n'
        '{"scenario": "data_migration", "budget_usd": "0.1"}\n'
        '{"scenario": "data_migration", "seed": ' + "1" * 5000 + "}\n"
    )
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["batch", str(goals), "--out", str(out), "--budget-usd", "1"])
    assert result.exit_code == 2
    text = result.output
    assert "8 invalid line(s); nothing was started" in text
    assert "line 8: seed: Input should be a valid integer" in text
    assert "line 9: budget_usd: Input should be a valid number" in text
    for expected in (
        "line 3: unknown scenario 'nowhere'",
        "line 4: not valid JSON",
        "line 5: strategy: Input should be",
        "line 6: must be a JSON object",
        "line 7: id 'line-1' is already used on line 1",
        "line 10: not valid JSON (JSON holds a number with too many digits to read)",
    ):
        assert expected in text
    assert "Traceback" not in text
    assert not out.exists()  # nothing written but the error


def test_goal_lines_end_at_newlines_only_and_a_byte_order_mark_is_not_a_goal(
    tmp_path: Path,
) -> None:
    # JSON allows U+2028, U+2029 and U+0085 unescaped inside strings, as json.dumps writes them
    # with ensure_ascii=False.
    lines = [
        json.dumps(
            {"goal": "first\u2028part\u0085two", "model": "openai:gpt-5-mini"}, ensure_ascii=False
        ),
        json.dumps({"goal": "second\u2029goal", "model": "openai:gpt-5-mini"}, ensure_ascii=False),
    ]
    path = tmp_path / "goals.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + ("\r\n".join(lines) + "\r\n").encode())
    goals = load_goals(path).goals
    assert [(g.id, g.spec.goal) for g in goals] == [
        ("line-1", "first\u2028part\u0085two"),
        ("line-2", "second\u2029goal"),
    ]


def test_a_key_given_twice_on_a_goal_line_is_refused_not_overwritten() -> None:
    # A JSON reader keeps the last value: this goal would run with a $10 cap.
    text = (
        '{"scenario": "data_migration", "budget_usd": 0.01, "seed": 1, "budget_usd": 10}\n'
        '{"scenario": "data_migration", "id": "a", "id": "b", "seed": 2, "seed": 2}\n'
        '{"scenario": "data_migration", "budget_usd": 0.01}\n'
    )
    with pytest.raises(UserInputError) as caught:
        parse_goals(text)
    message = str(caught.value)
    assert "2 invalid line(s)" in message
    assert "line 1: 'budget_usd' given more than once in one object: keep one" in message
    assert "line 2: 'id', 'seed' given more than once in one object: keep one" in message


def test_a_goals_line_takes_as_long_a_goal_as_a_run_does() -> None:
    from hierplan.plans.plan import MAX_GOAL_CHARS

    longest = ("x\n" * MAX_GOAL_CHARS)[: MAX_GOAL_CHARS - 1] + "x"  # its JSON escapes each \n
    line = json.dumps({"goal": longest, "model": "openai:gpt-5-mini"})
    (goal,) = parse_goals(line)
    assert goal.spec.goal == longest
    with pytest.raises(UserInputError, match="line 1: goal: String should have at most"):
        parse_goals(json.dumps({"goal": longest + "x", "model": "openai:gpt-5-mini"}))


def test_a_default_id_taken_by_another_line_says_so() -> None:
    text = '{"scenario": "data_migration", "id": "line-2"}\n{"scenario": "data_migration"}\n'
    with pytest.raises(UserInputError) as caught:
        parse_goals(text)
    assert (
        "line 2: its default id 'line-2' is already used on line 1: give this line an 'id' of "
        "its own"
    ) in str(caught.value)


def test_free_text_goals_need_a_real_model_and_known_fields() -> None:
    with pytest.raises(UserInputError, match="line 1: a free-text goal needs a real model"):
        parse_goals('{"goal": "write a poem"}')
    with pytest.raises(
        UserInputError, match="line 2: unknown key 'colour': the keys allowed are id, goal"
    ):
        parse_goals('{"scenario": "data_migration"}\n{"scenario": "data_migration", "colour": 1}')
    with pytest.raises(UserInputError, match="no goals"):
        parse_goals("\n\n")
    goals = parse_goals(
        '{"goal": "write a poem", "model": "openai:gpt-5-mini", "budget_usd": 0.5, "id": "p"}\n'
        '{"scenario": "data_migration", "strategy": "dag", "seed": 4}'
    )
    assert [(g.id, g.line, g.spec.kind) for g in goals] == [
        ("p", 1, "text"),
        ("line-2", 2, "scenario"),
    ]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3)
    ),
    max_leaves=10,
)
line_objects = st.dictionaries(
    st.sampled_from(
        [
            "goal",
            "scenario",
            "id",
            "model",
            "strategy",
            "seed",
            "budget_usd",
            "budget_tokens",
            "max_depth",
            "concurrency",
            "allocation",
            "extra",
            "executor_max_tokens",
            "step_timeout_s",
            "retry_backoff_s",
            "settings",
        ]
    ),
    json_values | st.sampled_from(["data_migration", "sim", "openai:gpt-5-mini", "dag", "equal"]),
    max_size=5,
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(st.text(max_size=40), line_objects.map(json.dumps), json_values.map(json.dumps)),
        max_size=6,
    )
)
def test_any_goals_file_parses_or_fails_with_line_numbers(lines: list[str]) -> None:
    text = "\n".join(lines)
    try:
        goals = parse_goals(text)
    except UserInputError as exc:
        message = str(exc)
        assert "no goals" in message or "line " in message
        return
    assert goals and len({g.id for g in goals}) == len(goals)
    for goal in goals:
        named = [goal.spec.goal, goal.spec.scenario, goal.spec.suite]
        assert sum(n is not None for n in named) == 1
        # What a line accepts, a run takes, and a worker reads back from the journal.
        assert BatchGoal.from_json(goal.to_json()) == goal
        RunOptions().settings(goal)


seed_values = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.integers().map(str),
    st.floats(allow_nan=False, allow_infinity=False),
    st.none(),
)


@settings(max_examples=300, deadline=None)
@given(seed=seed_values, key=st.text(min_size=1, max_size=12), value=json_values)
def test_a_goal_line_takes_its_seed_uncoerced_and_names_the_keys_allowed(
    seed: Any, key: str, value: Any
) -> None:
    """A seed is taken only as a JSON integer within the range --seed takes (never a boolean,
    a string or a float read as one); a key not allowed is refused, listing those allowed."""
    from hierplan.batch.goals import LINE_KEYS
    from hierplan.core.settings import MAX_SEED

    line = {"suite": "game24", "task": 0, "seed": seed}
    try:
        (goal,) = parse_goals(json.dumps(line))
    except UserInputError as exc:
        assert "line 1: seed: " in str(exc)
        assert not (type(seed) is int and 0 <= seed <= MAX_SEED)
    else:
        assert goal.spec.seed == seed and (seed is None or type(seed) is int)
        assert seed is None or 0 <= seed <= MAX_SEED
        if seed is not None:
            assert RunOptions().settings(goal).seed == seed
    try:
        parse_goals(json.dumps({"suite": "game24", "task": 0, key: value}))
    except UserInputError as exc:
        if key not in LINE_KEYS and key != "settings":
            assert f"unknown key {key!r}: the keys allowed are {', '.join(LINE_KEYS)}" in str(exc)
    else:
        assert key in LINE_KEYS


def test_the_seed_takes_the_same_range_on_the_command_line_as_in_goal_lines(
    tmp_path: Path,
) -> None:
    from hierplan.core.settings import MAX_SEED

    goals = tmp_path / "goals.jsonl"
    goals.write_text(f'{{"suite": "game24", "task": 0, "seed": {MAX_SEED + 1}}}\n')
    out = tmp_path / "out"
    refused = CliRunner().invoke(app, ["batch", str(goals), "--out", str(out)])
    assert refused.exit_code == 2 and f"less than or equal to {MAX_SEED}" in refused.output
    for seed in (str(MAX_SEED + 1), "-1"):
        for command in (["batch", str(goals), "--out", str(out)], ["run", "--scenario", "x"]):
            result = CliRunner().invoke(app, [*command, "--seed", seed])
            assert result.exit_code == 2 and "--seed" in result.output, result.output
            assert str(0 if seed == "-1" else MAX_SEED) in result.output, result.output
    assert not out.exists()


def test_a_line_sets_any_run_setting_checked_strictly_and_carried_to_the_run() -> None:
    line = {"scenario": "data_migration", "executor_max_tokens": 4096, "step_timeout_s": None}
    (goal,) = parse_goals(json.dumps(line | {"retry_backoff_s": 1}))
    # as a worker reads it back from the journal or the Celery message
    settings = RunOptions().settings(BatchGoal.from_json(goal.to_json()))
    assert (settings.executor_max_tokens, settings.step_timeout_s) == (4096, None)
    assert settings.retry_backoff_s == 1.0
    bad = (
        '{"scenario": "data_migration", "max_depth": 0, "executor_max_tokens": true}\n'
        '{"scenario": "data_migration", "settings": {"max_retries": 1}}\n'
    )
    with pytest.raises(UserInputError) as caught:
        parse_goals(bad)
    assert str(caught.value).splitlines()[1:] == [
        "  line 1: max_depth: Input should be greater than or equal to 1; "
        "executor_max_tokens: Input should be a valid integer",
        "  line 2: 'settings' is not a key of a line: write each run setting as a key",
    ]


def test_suite_task_lines_name_a_task_of_a_bench_suite() -> None:
    goals = parse_goals(
        '{"suite": "game24", "task": "game24-0-3"}\n'
        '{"suite": "blocksworld", "task": 2, "strategy": "dag", "id": "bw"}\n'
        '{"suite": "parallel_qa", "task": "parallel_qa-5-0", "model": "openai:gpt-5-mini"}'
    )
    assert [(g.id, g.spec.kind, g.spec.label()) for g in goals] == [
        ("line-1", "suite", "game24 task game24-0-3"),
        ("bw", "suite", "blocksworld task 2"),
        ("line-3", "suite", "parallel_qa task parallel_qa-5-0"),
    ]
    # the task's own text is the goal: the same one `hierplan bench` runs
    assert goals[0].spec.known_text() == get_suite("game24").generate(4, 0)[3].goal
    bad = (
        '{"suite": "chess", "task": 1}\n'
        '{"suite": "game24", "task": "blocksworld-0-1"}\n'
        '{"suite": "game24", "task": 10000}\n'
        '{"suite": "game24"}\n'
        '{"task": 3}\n'
        '{"suite": "game24", "task": true}\n'
        '{"suite": "game24", "task": 1, "scenario": "data_migration"}\n'
    )
    with pytest.raises(UserInputError) as caught:
        parse_goals(bad)
    message = str(caught.value)
    for expected in (
        "7 invalid line(s)",
        "line 1: unknown suite 'chess'",
        "line 2: task 'blocksworld-0-1' is not a task of game24",
        "line 3: task index 10000 is out of range",
        "line 4: 'suite' and 'task' go together",
        "line 5: 'suite' and 'task' go together",
        "line 6: task: must be a task id",
        "line 7: give one of 'goal', 'scenario' or 'suite', not scenario and suite",
    ):
        assert expected in message, message


def test_suite_tasks_run_and_are_judged_by_the_suite_verifier(tmp_path: Path) -> None:
    goals = tmp_path / "goals.jsonl"
    goals.write_text(
        '{"suite": "game24", "task": 0}\n{"suite": "blocksworld", "task": "blocksworld-0-1"}\n'
    )
    batch = BatchConfig(
        goals,
        tmp_path / "out",
        BatchBudget(None, usd_to_pico(1), 2),
        RunOptions(sim_latency_scale=0),
    )
    summary = anyio.run(run_batch, batch)
    assert summary["counts"]["succeeded"] == 2, summary
    game = json.loads((tmp_path / "out" / "goals" / "line-1" / "run.json").read_text())
    task = get_suite("game24").generate(1, 0)[0]
    assert game["goal"] == task.goal
    assert game["verification"]["ok"] and "= 24" in game["verification"]["summary"]
    blocks = json.loads((tmp_path / "out" / "goals" / "line-2" / "run.json").read_text())
    assert "valid actions" in blocks["verification"]["summary"]


# -- per-goal simulator seeds --------------------------------------------------------------


def test_goal_seeds_derive_from_the_batch_seed_and_the_goal_id() -> None:
    goals = parse_goals(
        '{"suite": "game24", "task": 0, "id": "a"}\n'
        '{"suite": "game24", "task": 0, "id": "b"}\n'
        '{"suite": "game24", "task": 0, "id": "c", "seed": 7}'
    )
    seeds = [RunOptions(seed=1).settings(g).seed for g in goals]
    assert seeds == [goal_seed(1, "a"), goal_seed(1, "b"), 7]
    assert len(set(seeds)) == 3
    assert [RunOptions(seed=2).settings(g).seed for g in goals][:2] != seeds[:2]
    digest = hashlib.sha256(b"1:a").digest()  # the documented derivation
    assert goal_seed(1, "a") == int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def test_goals_with_the_same_task_get_their_own_noise_and_keep_it(tmp_path: Path) -> None:
    goals = tmp_path / "goals.jsonl"
    goals.write_text("".join(f'{{"suite": "game24", "task": 5, "id": "g{i}"}}\n' for i in range(4)))

    def run_into(out: Path) -> dict[str, tuple[int, int]]:
        batch = BatchConfig(
            goals,
            out,
            BatchBudget(None, usd_to_pico(1), 4),
            RunOptions(seed=3, sim_latency_scale=0),
        )
        anyio.run(run_batch, batch)
        found = {}
        for goal_id in ("g0", "g1", "g2", "g3"):
            record = json.loads((out / "goals" / goal_id / "run.json").read_text())
            found[goal_id] = (record["seed"], record["budget"]["spent"]["tokens"])
        return found

    first = run_into(tmp_path / "one")
    assert len({seed for seed, _ in first.values()}) == 4
    # The same task under different seeds: the simulator's noise differs between goals.
    assert len({tokens for _, tokens in first.values()}) > 1, first
    assert run_into(tmp_path / "two") == first  # a rerun draws the same noise
    # A resumed batch takes its goals and options from the journal: the same seeds again.
    journal = Journal(tmp_path / "one" / "journal.sqlite")
    options = RunOptions.from_dict(journal.meta()["options"])
    resumed = {r.id: options.settings(r.goal).seed for r in journal.rows()}
    journal.close()
    assert resumed == {goal_id: seed for goal_id, (seed, _) in first.items()}


# -- grants --------------------------------------------------------------------------------


def test_grants_cap_wait_shrink_and_skip() -> None:
    cap, minimum = (None, 100), (0, 10)
    assert decide((None, 500), cap, minimum, others_running=True) == ("grant", (None, 100))
    assert decide((None, 50), cap, minimum, others_running=True) == ("wait", (None, None))
    assert decide((None, 50), cap, minimum, others_running=False) == ("grant", (None, 50))
    assert decide((None, 5), cap, minimum, others_running=False) == ("skip", (None, None))
    assert decide((1_000, None), (300, None), (10, 0), others_running=False) == (
        "grant",
        (300, None),
    )


def test_a_200_goal_batch_stops_at_its_budget(tmp_path: Path) -> None:
    goals = text_goals(tmp_path / "goals.jsonl", 200)
    probe = anyio.run(
        run_batch, config(text_goals(tmp_path / "one.jsonl", 1), tmp_path / "p", None, 1)
    )
    per_goal = probe["spent_pico"]
    budget = per_goal * 200 * 0.6 / 1e12  # about 60% of what the whole batch would cost
    summary = anyio.run(run_batch, config(goals, tmp_path / "out", budget, 8))
    counts = summary["counts"]
    assert summary["spent_pico"] <= usd_to_pico(budget)
    assert counts["succeeded"] + counts["failed"] + counts["skipped"] == 200
    assert 110 <= counts["succeeded"] <= 125, counts
    assert counts["skipped"] >= 70
    journal = Journal(tmp_path / "out" / "journal.sqlite")
    rows = journal.rows()
    assert {(r.reason or "").split(":")[0] for r in rows if r.state == "skipped"} == {"budget"}
    assert [r.state for r in rows].index("skipped") > 100  # the goals left, in file order
    recorded = 0
    for row in rows:
        run_json = tmp_path / "out" / "goals" / row.id / "run.json"
        if row.state == "skipped":
            assert not run_json.exists()
            continue
        spent = json.loads(run_json.read_text())["budget"]["spent"]
        assert spent["pico"] == row.spent_pico  # each run's own record agrees with the journal
        recorded += row.spent_pico
    assert recorded == summary["spent_pico"]
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["counts"] == counts


def test_resume_refuses_a_changed_goals_file(tmp_path: Path) -> None:
    goals = text_goals(tmp_path / "goals.jsonl", 2)
    anyio.run(run_batch, config(goals, tmp_path / "out", 1.0, 2))
    with pytest.raises(UserInputError, match="already holds a batch"):
        anyio.run(run_batch, config(goals, tmp_path / "out", 1.0, 2))
    # A batch goes on as it was started: a budget or an option given anew is refused, not
    # silently dropped.
    with pytest.raises(UserInputError, match="with --budget-usd, --concurrency: a batch goes on"):
        anyio.run(run_batch, config(goals, tmp_path / "out", 5.0, 8, resume=True))
    text_goals(goals, 3)
    with pytest.raises(UserInputError, match="changed since the batch started"):
        anyio.run(run_batch, config(goals, tmp_path / "out", 1.0, 2, resume=True))


def test_a_resume_reads_its_goals_with_the_model_the_batch_was_started_with(
    tmp_path: Path,
) -> None:
    # Free-text goals that take the batch's --model: the resume command printed after Ctrl-C
    # does not repeat it, and the batch goes on with the model kept in its journal.
    goals = tmp_path / "goals.jsonl"
    goals.write_text(
        "".join(json.dumps({"goal": f"q{i}", "strategy": "react"}) + "\n" for i in range(2))
    )
    first = config(goals, tmp_path / "out", 1.0, 2)
    first.options = RunOptions(model=PRICED_AS, sim_latency_scale=0)
    assert anyio.run(run_batch, first)["counts"]["succeeded"] == 2
    journal = Journal(tmp_path / "out" / "journal.sqlite")
    with journal.transaction() as db:  # as a crash leaves it: one goal still running
        db.execute("UPDATE goals SET state = 'running' WHERE id = 'line-2'")
    journal.close()
    resumed = anyio.run(run_batch, config(goals, tmp_path / "out", None, 4, resume=True))
    assert resumed["counts"]["succeeded"] == 2
    assert resumed["resumed_running_goals"] == ["line-2"]
    record = json.loads((tmp_path / "out" / "goals" / "line-2" / "run.json").read_text())
    assert record["stats"]["priced_as"] == [PRICED_AS]


def test_a_batch_directory_is_run_by_one_process_at_a_time(tmp_path: Path) -> None:
    goals = text_goals(tmp_path / "goals.jsonl", 2)
    out = tmp_path / "out"
    anyio.run(run_batch, config(goals, out, 1.0, 2))
    running = open_journal(out, resume=True)  # as a batch still running holds it
    try:
        # A second process resuming it would run the same pending goals on the same budget.
        # (Held here by this test's process, which the message says instead of "another".)
        busy = rf"out is in use by another run in this process \(process {os.getpid()}\)"
        with pytest.raises(UserInputError, match=busy):
            anyio.run(run_batch, config(goals, out, 1.0, 2, resume=True))
    finally:
        running.close()
    assert not (out / "batch.lock").exists()  # the holder deletes it as it lets go
    assert anyio.run(run_batch, config(goals, out, 1.0, 2, resume=True))["counts"]["succeeded"] == 2


# -- a crash and a resume ------------------------------------------------------------------


def _script(*args: str) -> list[str]:
    return [sys.executable, str(HERE / "batch_support.py"), *args]


def test_sigkill_mid_batch_then_resume_loses_nothing(tmp_path: Path) -> None:
    goals = text_goals(tmp_path / "goals.jsonl", 40)
    out = tmp_path / "out"
    args = [str(out), str(goals), "1.0", "4"]
    process = subprocess.Popen(_script(*args), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    journal_path = out / "journal.sqlite"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.05)
        if not journal_path.exists():
            continue
        journal = Journal(journal_path)
        rows = journal.rows()
        journal.close()
        finished = [r for r in rows if r.state == "succeeded"]
        running_now = [r for r in rows if r.state == "running"]
        if len(finished) >= 8 and running_now:
            os.kill(process.pid, signal.SIGKILL)
            break
    process.wait(10)
    assert process.returncode == -signal.SIGKILL
    journal = Journal(journal_path)
    killed = journal.rows()
    journal.close()
    before = {r.id: (r.state, r.finished_at) for r in killed}
    running = [r.id for r in killed if r.state == "running"]
    assert running and any(s == "pending" for s, _ in before.values())
    spent_before = sum(r.total_pico for r in killed)

    resumed = subprocess.run(
        _script(*args, "--resume"), capture_output=True, text=True, timeout=120
    )
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads(resumed.stdout.strip().splitlines()[-1])
    assert summary["resumed_running_goals"] == running
    journal = Journal(journal_path)
    rows = journal.rows()
    assert all(r.state == "succeeded" for r in rows)  # no goal lost
    for row in rows:
        state, finished_at = before[row.id]
        if state == "succeeded":  # finished before the crash: not run again
            assert (row.attempts, row.finished_at) == (1, finished_at)
        if row.id in running:  # ran again; what the first attempt spent stays spent
            assert row.attempts == 2
    assert summary["spent_pico"] == sum(r.total_pico for r in rows)
    assert summary["spent_pico"] == journal.spent()[1]
    assert summary["spent_pico"] >= spent_before  # nothing spent before the crash was forgotten
    prior = sum(r.prior_pico for r in rows)
    assert prior > 0 and prior == sum(r.prior_pico for r in rows if r.id in running)
    assert summary["retried_spent_usd"] == pytest.approx(prior / 1e12)
    assert summary["spent_pico"] <= usd_to_pico(1.0)
    assert len(list((out / "goals").glob("*/run.json"))) == 40


def test_an_interrupted_batch_counts_the_calls_it_cut_short_as_spent(tmp_path: Path) -> None:
    """Ctrl-C counts as a crash does: a call in flight may have been billed, so the goal it
    belonged to keeps what the call held as spent, for the resume to go on from."""
    goals = text_goals(tmp_path / "goals.jsonl", 2)

    async def interrupted() -> None:
        with anyio.move_on_after(1.0):  # the second goal's call never returns
            await run_batch(config(goals, tmp_path / "out", 1.0, 2, hold="Answer question 1"))

    anyio.run(interrupted)
    done, cut = Journal(tmp_path / "out" / "journal.sqlite").rows()
    assert (done.state, cut.state) == ("succeeded", "running")
    # The same question's call: the finished one spent its input and 200 output tokens; the
    # one cut short counts its input and all of max_tokens, as its reservation held.
    max_tokens = RunSettings().executor_max_tokens
    assert cut.spent_tokens == done.spent_tokens - 200 + max_tokens
    assert cut.spent_pico > done.spent_pico > 0


def test_the_batch_ledger_write_off_counts_held_calls_as_spent() -> None:
    from redis_support import require_redis

    from hierplan.budgets.redis_ledger import RedisLedger

    server = require_redis()

    async def main() -> None:
        ledger = RedisLedger(server.url)
        root = await ledger.open("batch", None, Fixed(None, 1_000))
        goal = await ledger.open("goal", root, Fixed(None, 400))
        done = await ledger.reserve(goal, 10, 100, "execution")
        held = await ledger.reserve(goal, 10, 150, "execution")
        assert done is not None and held is not None
        await ledger.settle(done, 5, 60)
        again = await ledger.account(goal.id)  # as another process finds it
        balance = await ledger.write_off(again)
        assert (balance.spent_pico, balance.released_pico, balance.closed) == (210, 190, True)
        assert await ledger.available(root) == (None, 790)
        with pytest.raises(Exception, match="closed"):
            await ledger.reserve(goal, 1, 1, "execution")
        ledger.drop()

    anyio.run(main)


def test_a_dropped_redis_ledger_refuses_its_accounts_and_writes_nothing() -> None:
    from redis_support import require_redis

    from hierplan.budgets.budget import LedgerError
    from hierplan.budgets.redis_ledger import RedisLedger

    server = require_redis()

    async def main() -> None:
        ledger = RedisLedger(server.url)
        root = await ledger.open("batch", None, Fixed(None, 1_000))
        goal = await ledger.open("goal", root, Fixed(None, 400))
        held = await ledger.reserve(goal, 10, 100, "execution")
        assert held is not None
        assert ledger.drop() > 0  # the batch finished
        # A delivery still running from that batch: read as empty, its account would have no
        # limit at all; it is refused instead, and nothing comes back into Redis.
        for operation in (
            ledger.reserve(goal, 1, 1, "execution"),
            ledger.available(goal),
            ledger.close(goal),
            ledger.write_off(goal),
            ledger.open("late", root, Fixed(None, 1)),
        ):
            with pytest.raises(LedgerError, match=rf"no account '{root.id}'|'{goal.id}'|unknown"):
                await operation
        with pytest.raises(LedgerError, match="settled twice"):
            await ledger.settle(held, 1, 1)
        assert list(ledger.client.scan_iter(match=f"{{{ledger.namespace}}}:*")) == []

    anyio.run(main)


def test_the_redis_ledger_counts_exactly_on_both_sides_of_its_arithmetic_shortcut() -> None:
    from redis_support import require_redis

    from hierplan.budgets.ledger import Ledger, LocalLedger
    from hierplan.budgets.redis_ledger import RedisLedger

    server = require_redis()
    # 15 digits take the double-precision shortcut; past it, the digit-group arithmetic.
    amounts = [999_999_999_999_999, 10**15, 2**53 + 1, 10**18 + 7, 3]

    async def figures(ledger: Ledger) -> list[object]:
        root = await ledger.open("batch", None, Fixed(10**21, 10**21))
        goal = await ledger.open("goal", root, Fixed(10**20, 10**20 + 1))
        for held, used in zip(amounts, reversed(amounts), strict=True):
            reservation = await ledger.reserve(goal, held, held + 1, "execution")
            assert reservation is not None
            await ledger.settle(reservation, used, used + 1)  # some under, some over
        closed = await ledger.close(goal)
        return [closed, await ledger.balance(root), await ledger.available(root)]

    async def main() -> None:
        redis_ledger = RedisLedger(server.url)
        assert await figures(redis_ledger) == await figures(LocalLedger())
        redis_ledger.drop()

    anyio.run(main)


def test_the_batch_benchmark_runs_at_a_small_size(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--goals", "1", "--tasks", "4", "--pairs", "50", "--concurrency", "2", "--no-celery"]
    figures = load_benchmark().main(argv)
    assert figures["game24_local_goals_per_s"] > 0
    assert figures["data_migration_local_goals_per_s"] > 0
    assert figures["local_ledger_pairs_per_s"] > 0
    assert "game24_celery_goals_per_s" not in figures
    if shutil.which("redis-server"):
        assert figures["redis_vs_local_ledger"] > 0
    assert "game24_local_goals_per_s:" in capsys.readouterr().out


def test_a_budget_beyond_what_the_journal_counts_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    goals = text_goals(tmp_path / "goals.jsonl", 2)
    with pytest.raises(UserInputError, match=r"--budget-usd is too large: at most \$9,223,372"):
        anyio.run(run_batch, config(goals, tmp_path / "out", 100_000_000.0, 2))
    assert not (tmp_path / "out").exists()


def test_provider_goals_without_an_api_key_are_refused_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    goals = text_goals(tmp_path / "goals.jsonl", 2)  # goals for openai:gpt-5-mini
    batch = BatchConfig(goals, tmp_path / "out", BatchBudget(None, None, 2), RunOptions())
    with pytest.raises(UserInputError, match=r"set OPENAI_API_KEY \(needed by lines 1, 2\)"):
        anyio.run(run_batch, batch)
    assert not (tmp_path / "out").exists()


def test_an_unpriced_goal_model_under_a_usd_budget_says_what_a_batch_can_do(
    tmp_path: Path,
) -> None:
    path = tmp_path / "goals.jsonl"
    path.write_text('{"suite": "game24", "task": 0, "model": "sim:my-model"}\n')
    batch = BatchConfig(path, tmp_path / "out", BatchBudget(None, 10**12, 1), RunOptions())
    # A batch takes --price-in/--price-out as a run does: the message names them.
    with pytest.raises(UserInputError, match=r"line 1: no price is known for model 'my-model'"):
        anyio.run(run_batch, batch)
    with pytest.raises(UserInputError, match=r"give its price with --price-in/--price-out"):
        anyio.run(run_batch, batch)
    priced = RunOptions(sim_latency_scale=0, price_in=1.0, price_out=2.0)
    batch = BatchConfig(path, tmp_path / "out", BatchBudget(None, 10**12, 1), priced)
    summary = anyio.run(run_batch, batch)
    assert summary["counts"]["succeeded"] == 1 and summary["spent_usd"] > 0


def test_the_batch_panel_without_a_terminal_ends_its_lines(tmp_path: Path) -> None:
    goals = tmp_path / "goals.jsonl"
    goals.write_text('{"suite": "game24", "task": 0}\n')
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app, ["batch", str(goals), "--out", str(out), "--sim-latency-scale", "0"]
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    panel = [line for line in lines if "spent+held" in line]
    assert panel, result.output  # what running goals hold is named as such
    assert any(line.strip().startswith("batch summary") for line in lines), result.output


def test_a_batch_on_the_simulator_says_so_in_its_summary(tmp_path: Path) -> None:
    goals = tmp_path / "goals.jsonl"
    goals.write_text('{"suite": "game24", "task": 0}\n{"suite": "crafting", "task": 0}\n')
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app, ["batch", str(goals), "--out", str(out), "--sim-latency-scale", "0"]
    )
    assert result.exit_code == 0, result.output
    assert "offline simulator for 2 of 2 goals [SIMULATED]" in result.output, result.output
    finished = [line for line in result.output.splitlines() if line.startswith("succeeded")]
    assert len(finished) == 2 and all(line.split()[2].startswith("$") for line in finished), (
        finished
    )  # the state, the goal's id, its cost: "succeeded" is not said twice
    summary = json.loads((out / "summary.json").read_text())
    assert summary["simulated_goals"] == 2


def test_a_batch_whose_collector_cannot_be_reached_says_so_in_one_line(tmp_path: Path) -> None:
    goals = tmp_path / "goals.jsonl"
    goals.write_text('{"suite": "game24", "task": 0}\n')
    env = {**os.environ, "OTEL_EXPORTER_OTLP_TIMEOUT": "2", "OTEL_METRICS_EXPORTER": "none"}
    result = subprocess.run(
        [sys.executable, "-m", "hierplan", "batch", str(goals), "--out", str(tmp_path / "out"),
         "--sim-latency-scale", "0", "--trace", "otlp=http://127.0.0.1:1"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("warning: the trace could not be exported"), lines[0]


def test_a_celery_batch_whose_redis_is_down_writes_nothing(tmp_path: Path) -> None:
    goals = tmp_path / "goals.jsonl"
    goals.write_text('{"suite": "game24", "task": 0}\n')
    out = tmp_path / "out"
    broker = "redis://:s3cret@127.0.0.1:1/0"
    result = subprocess.run(
        [sys.executable, "-m", "hierplan", "batch", str(goals), "--out", str(out),
         "--backend", "celery", "--broker", broker, "--sim-latency-scale", "0"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""  # no panel for a batch that never started
    lines = result.stderr.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: cannot reach Redis at redis://:PASSWORD@127.0.0.1:1/0")
    assert not out.exists()  # the same command works as it is once Redis is up


def test_an_interrupted_batch_names_the_command_that_resumes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def interrupted(batch: object) -> dict[str, object]:
        raise KeyboardInterrupt

    monkeypatch.setattr("hierplan.cli.batch.execute", interrupted)
    # No Redis here: the broker is only named, in the command that resumes the batch.
    monkeypatch.setattr("hierplan.cli.batch.check_reachable", lambda url, shown: None)
    where = tmp_path / "my batches"
    where.mkdir()
    goals = where / "goals.jsonl"
    goals.write_text('{"suite": "game24", "task": 0}\n')
    out = where / "out"
    broker = "redis://:s3cret@127.0.0.1:6390/0"
    result = CliRunner().invoke(
        app,
        ["batch", str(goals), "--out", str(out), "--backend", "celery", "--broker", broker],
    )
    assert result.exit_code == 130, result.output
    message = " ".join(result.output.split())  # the console may wrap it
    command = message.split("continue with: ", 1)[1]
    assert shlex.split(command) == [
        "hierplan",
        "batch",
        str(goals),
        "--out",
        str(out),
        "--resume",
        "--backend",
        "celery",
        "--broker",
        "redis://:PASSWORD@127.0.0.1:6390/0",
    ]
    assert "s3cret" not in result.output


def test_the_batch_panel_follows_goals_while_they_run(tmp_path: Path) -> None:
    from io import StringIO

    from rich.console import Console

    from hierplan.batch.display import BatchDisplay, Tally

    goals = text_goals(tmp_path / "goals.jsonl", 1)
    batch = config(goals, tmp_path / "out", 1.0, 1)
    display = BatchDisplay(Console(file=StringIO()), Tally(1, {}, 0, 0, None, None))
    seen: list[tuple[int, int]] = []
    drawn: list[str] = []
    run_stand_in = batch.run_fn

    async def then_look(goal: str | None, **kwargs: Any) -> RunResult:
        result = await run_stand_in(goal, **kwargs)
        await anyio.sleep(0.75)  # the goal still runs, its calls settled
        seen.append((display.tally.counts["running"], display.tally.spent_pico))
        panel = StringIO()
        Console(file=panel, width=200, color_system=None).print(display.live.get_renderable())
        drawn.append(panel.getvalue())
        return result

    batch.run_fn = then_look
    with display:
        summary = anyio.run(run_batch, batch, display)
    # While the goal ran, the panel showed it running, what its calls had spent, and what the
    # batch's budget had left.
    assert seen == [(1, summary["spent_pico"])]
    assert summary["spent_pico"] > 0
    left = pico_to_usd(usd_to_pico(1.0) - summary["spent_pico"])
    assert f"remaining ${left:.4f}" in drawn[0], drawn[0]
    assert display.tally.counts["succeeded"] == 1 and display.tally.finished_now == 1


# -- a Celery worker's delivery, against Redis -----------------------------------------------


def _delivery(url: str, namespace: str, root: str) -> dict[str, object]:
    goal = parse_goals('{"suite": "game24", "task": 0, "id": "g"}')[0]
    budget = {"tokens": None, "pico": 10**12, "concurrency": 1}
    return {
        "redis": url,
        "namespace": namespace,
        "root": root,
        "options": RunOptions(sim_latency_scale=0).to_dict(),
        "budget": {**budget, "goal_tokens": None, "goal_pico": None},
        "goal": goal.to_json(),
    }


def test_a_delivery_that_fails_records_the_goal_failed_and_returns_its_grant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import redis
    from redis_support import require_redis

    from hierplan.batch.celery_backend import WorkerState, done_key, goal_key, work_on_goal
    from hierplan.budgets.redis_ledger import RedisLedger

    server = require_redis()
    worker = WorkerState()
    worker.workdir = tmp_path
    gone = RedisLedger(server.url)
    client = gone.client
    # The batch's ledger is gone from Redis (the batch finished and deleted it, or Redis lost
    # it): a message delivered late writes nothing there, where a claim would leave the goal's
    # keys for ever. The driver, if it still runs, says the ledger was lost.
    lost = _delivery(server.url, gone.namespace, "404")
    assert anyio.run(work_on_goal, lost, worker) == "gone"
    assert list(client.scan_iter(match=f"{{{gone.namespace}}}:*")) == []
    assert not client.exists(goal_key(gone.namespace, "g"), done_key(gone.namespace))

    # Redis fails while the goal's account closes: the account is written off, so what it
    # spent is counted on the goal and the rest of its grant returns to the batch.
    async def unreachable(self: RedisLedger, account: object) -> None:
        raise redis.ConnectionError("Connection reset by peer")

    monkeypatch.setattr(RedisLedger, "close", unreachable)
    ledger = RedisLedger(server.url)
    root = anyio.run(ledger.open, "batch", None, Fixed(None, 10**12))
    assert anyio.run(work_on_goal, _delivery(server.url, ledger.namespace, root.id), worker)
    state = ledger.client.hgetall(goal_key(ledger.namespace, "g"))
    assert state["state"] == "failed" and "ConnectionError" in state["reason"]
    balance = anyio.run(ledger.balance, root)
    assert (balance.granted_pico, balance.reserved_pico) == (0, 0)
    assert balance.spent_pico == int(state["spent_pico"]) > 0
    ledger.drop()


def test_a_delivery_that_cannot_reach_redis_is_delivered_again() -> None:
    from redis_support import free_port

    from hierplan.batch.celery_backend.worker import WORKER, _goal_task

    class Retried(Exception):
        pass

    class Task:
        class request:  # as Celery names it: the task's current message
            id = "task-1"
            retries = 0

        def retry(self, *, exc: Exception, countdown: float) -> Exception:
            return Retried(exc)

    nowhere = f"redis://127.0.0.1:{free_port()}/0"
    try:
        with pytest.raises(Retried, match="Connect"):
            _goal_task(Task(), _delivery(nowhere, "test-nowhere", "1"))
    finally:
        WORKER.stop()


def test_a_settlement_lost_by_redis_still_lets_the_goal_finish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import redis
    from redis_support import require_redis

    from hierplan.batch.celery_backend import WorkerState, goal_key, work_on_goal
    from hierplan.budgets.budget import Reservation
    from hierplan.budgets.redis_ledger import RedisLedger

    server = require_redis()
    worker = WorkerState()
    worker.workdir = tmp_path
    settle = RedisLedger.settle
    lost: list[Reservation] = []

    async def flaky(self: RedisLedger, reservation: Reservation, tokens: int, pico: int) -> None:
        if not lost:  # the first settlement never reaches Redis
            lost.append(reservation)
            raise redis.ConnectionError("Connection reset by peer")
        await settle(self, reservation, tokens, pico)

    monkeypatch.setattr(RedisLedger, "settle", flaky)
    ledger = RedisLedger(server.url)
    root = anyio.run(ledger.open, "batch", None, Fixed(None, 10**12))
    assert anyio.run(work_on_goal, _delivery(server.url, ledger.namespace, root.id), worker) == "ok"
    state = ledger.client.hgetall(goal_key(ledger.namespace, "g"))
    assert state["state"] in ("succeeded", "failed"), state  # final: the driver goes on
    balance = anyio.run(ledger.balance, root)
    assert (balance.granted_pico, balance.reserved_pico) == (0, 0)
    # the call whose settlement was lost counts at its worst case
    assert balance.spent_pico == int(state["spent_pico"]) >= lost[0].pico
    ledger.drop()


def test_a_celery_batch_whose_ledger_redis_lost_says_so_instead_of_waiting(
    tmp_path: Path,
) -> None:
    import threading

    from redis_support import require_redis

    from hierplan.batch.celery_backend import QUEUE
    from hierplan.batch.core import execute, prepare
    from hierplan.budgets.redis_ledger import RedisLedger, connect

    url = require_redis().url.rsplit("/", 1)[0] + "/3"  # a database of this test's own
    client = connect(url)
    goals = tmp_path / "goals.jsonl"
    goals.write_text('{"suite": "game24", "task": 0}\n')

    def celery_batch(out: Path) -> BatchConfig:
        budget = BatchBudget(None, usd_to_pico(1), 1)
        return BatchConfig(goals, out, budget, backend="celery", broker=url)

    async def run_for_a_while(batch: object) -> None:
        with anyio.fail_after(20):
            await execute(batch)  # type: ignore[arg-type]

    try:
        # Resumed on a Redis without the batch's ledger (another --broker, or data lost).
        batch = prepare(celery_batch(tmp_path / "resumed"))
        batch.meta["root_account"] = "404"
        with pytest.raises(UserInputError, match="does not hold the ledger of the batch"):
            anyio.run(run_for_a_while, batch)
        batch.journal.close()

        # Lost while the batch runs: its goal's message is queued, no worker takes it, and
        # then Redis loses its data.
        batch = prepare(celery_batch(tmp_path / "running"))
        namespace = batch.meta["namespace"]

        def lose_the_data() -> None:
            while not client.llen(QUEUE):
                time.sleep(0.05)
            RedisLedger(client, namespace).drop()
            client.delete(QUEUE)

        loser = threading.Thread(target=lose_the_data, daemon=True)
        loser.start()
        with pytest.raises(UserInputError, match="Redis lost its data"):
            anyio.run(run_for_a_while, batch)
        loser.join(5)
        batch.journal.close()
    finally:
        client.flushdb()
        client.close()


def _celery_batch_on_a_worker_thread(
    tmp_path: Path, database: int, latency: float, display: object = None
) -> tuple[dict[str, object], list[str], Journal]:
    """A one-goal Celery batch driven here, its goal run by ``work_on_goal`` in a thread (as a
    worker takes the goal's message) on this test's own Redis database: the summary, the keys
    of the batch left in Redis, and the journal."""
    import threading

    from redis_support import require_redis

    from hierplan.batch.celery_backend import QUEUE, WorkerState, work_on_goal
    from hierplan.batch.core import execute, prepare
    from hierplan.budgets.redis_ledger import connect

    url = require_redis().url.rsplit("/", 1)[0] + f"/{database}"
    client = connect(url)
    goals = tmp_path / "goals.jsonl"
    goals.write_text('{"suite": "game24", "task": 0, "id": "g"}\n')
    out = tmp_path / "out"
    budget = BatchBudget(None, usd_to_pico(1), 1)
    config = BatchConfig(goals, out, budget, RunOptions(sim_latency_scale=latency), "celery")
    config.broker = url
    batch = prepare(config)
    batch.display = display  # type: ignore[assignment]
    worker = WorkerState()
    worker.workdir = tmp_path / "worker"

    def work() -> None:
        while not client.llen(QUEUE):
            time.sleep(0.05)
        journal = Journal(out / "journal.sqlite")
        meta, (row,) = journal.meta(), journal.rows()
        journal.close()
        payload = {
            "redis": url,
            "namespace": meta["namespace"],
            "root": meta["root_account"],
            "options": meta["options"],
            "budget": meta["budget"],
            "goal": row.goal.to_json(),
        }
        assert anyio.run(work_on_goal, payload, worker) == "ok"

    async def drive() -> dict[str, object]:
        with anyio.fail_after(60):
            return await execute(batch)

    try:
        worker_thread = threading.Thread(target=work, daemon=True)
        worker_thread.start()
        summary = anyio.run(drive)
        worker_thread.join(5)
        left = sorted(client.scan_iter(match=f"{{{batch.meta['namespace']}}}:*"))
        return summary, left, batch.journal
    finally:
        client.flushdb()
        client.close()


def test_a_finished_celery_batch_leaves_nothing_in_redis_and_resumes_without_it(
    tmp_path: Path,
) -> None:
    from redis_support import require_redis

    from hierplan.batch.core import execute, prepare

    summary, left, journal = _celery_batch_on_a_worker_thread(tmp_path, 4, 0)
    assert summary["counts"]["succeeded"] == 1  # type: ignore[index]
    assert left == []  # the ledger, the goal's hash and the announcements are deleted
    # The journal keeps what they held: the goal's record and spend, the ledger's figures.
    assert json.loads(journal.row("g").record or "")["status"] == "succeeded"
    spent = summary["spent_pico"]
    assert isinstance(spent, int) and journal.meta()["ledger"]["spent_pico"] == spent > 0
    assert (tmp_path / "out" / "goals" / "g" / "run.json").exists()
    journal.close()
    # Resumed, the finished batch runs nothing and does not call its ledger lost.
    url = require_redis().url.rsplit("/", 1)[0] + "/4"
    options = RunOptions(sim_latency_scale=0)
    budget = BatchBudget(None, usd_to_pico(1), 1)
    goals, out = tmp_path / "goals.jsonl", tmp_path / "out"
    config = BatchConfig(goals, out, budget, options, "celery", resume=True, broker=url)
    batch = prepare(config)
    try:
        again = anyio.run(execute, batch)
    finally:
        batch.journal.close()
    assert again["counts"]["succeeded"] == 1 and again["finished_by_this_run"] == 0


def test_the_celery_batch_panel_counts_what_goals_hold_on_workers(tmp_path: Path) -> None:
    import threading
    from io import StringIO

    from rich.console import Console

    from hierplan.batch.display import BatchDisplay, Tally

    display = BatchDisplay(Console(file=StringIO()), Tally(1, {}, 0, 0, None, None))
    seen: list[int] = []
    stop = threading.Event()

    def watch() -> None:  # what the panel shows while the goal runs on its worker
        while not stop.wait(0.05):
            if display.tally.counts.get("running"):
                seen.append(display.tally.spent_pico)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        # At the simulator's latency the goal's planning call is held for a second or more.
        summary, _, journal = _celery_batch_on_a_worker_thread(tmp_path, 5, 1.0, display)
    finally:
        stop.set()
        watcher.join(5)
    journal.close()
    assert summary["counts"]["succeeded"] == 1  # type: ignore[index]
    assert seen and max(seen) > 0, seen


def test_an_interrupted_celery_driver_never_journals_a_goal_it_did_not_send(
    tmp_path: Path,
) -> None:
    import asyncio

    from redis_support import require_redis

    from hierplan.batch.celery_backend import QUEUE
    from hierplan.batch.core import execute, prepare
    from hierplan.budgets.redis_ledger import connect

    url = require_redis().url.rsplit("/", 1)[0] + "/6"  # a database of this test's own
    client = connect(url)
    goals = tmp_path / "goals.jsonl"
    goals.write_text('{"suite": "game24", "task": 0}\n{"suite": "game24", "task": 1}\n')
    budget = BatchBudget(None, usd_to_pico(1), 2)
    batch = prepare(BatchConfig(goals, tmp_path / "out", budget, backend="celery", broker=url))
    start = batch.journal.start

    def start_then_interrupted(
        goal_id: str, grant: tuple[int | None, int | None], account: str | None = None
    ) -> None:
        start(goal_id, grant, account)
        task = asyncio.current_task()
        assert task is not None
        task.cancel()  # Ctrl-C arrives while the goal is journaled

    batch.journal.start = start_then_interrupted  # type: ignore[method-assign]
    try:
        with pytest.raises(asyncio.CancelledError):
            anyio.run(execute, batch)
        running = [r.id for r in batch.journal.rows() if r.state == "running"]
        # A resume follows the goals journaled as running: each has its message to wait for.
        assert running and client.llen(QUEUE) == len(running)
    finally:
        batch.journal.close()
        client.flushdb()
        client.close()


def test_a_worker_given_a_broker_that_is_no_redis_url_says_so_before_it_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from celery import Celery

    def started(*args: object, **kwargs: object) -> None:
        raise AssertionError("the worker started")

    monkeypatch.setattr(Celery, "worker_main", started)
    result = CliRunner().invoke(app, ["worker", "--broker", "127.0.0.1:6379"])
    assert result.exit_code == 2, result.output
    assert "error: not a Redis URL: '127.0.0.1:6379'" in result.output
    assert "redis://" in result.output


def test_a_resume_refuses_a_flag_given_at_its_default_that_differs_from_the_batch(
    tmp_path: Path,
) -> None:
    goals = tmp_path / "goals.jsonl"
    goals.write_text('{"suite": "game24", "task": 0}\n')
    out = str(tmp_path / "out")
    start = ["batch", str(goals), "--out", out, "--sim-latency-scale", "0"]
    first = CliRunner().invoke(app, [*start, "-c", "2", "--seed", "5"])
    assert first.exit_code == 0, first.output
    # 4 and 0 are the defaults of --concurrency and --seed: given, they differ all the same.
    again = CliRunner().invoke(app, [*start, "--resume", "-c", "4", "--seed", "0"])
    assert again.exit_code == 2, again.output
    assert f"cannot resume {out} with --concurrency, --seed" in " ".join(again.output.split())
    same = CliRunner().invoke(app, [*start, "--resume", "-c", "2", "--seed", "5"])
    assert same.exit_code == 0, same.output


def test_resuming_a_celery_batch_without_its_backend_says_what_to_give(tmp_path: Path) -> None:
    goals = tmp_path / "goals.jsonl"
    goals.write_text('{"suite": "game24", "task": 0}\n')
    out = tmp_path / "out"
    start = ["batch", str(goals), "--out", str(out), "--sim-latency-scale", "0"]
    assert CliRunner().invoke(app, start).exit_code == 0
    journal = open_journal(out, resume=True)
    journal.set_meta("backend", "celery")  # as a batch started on Celery workers has it
    journal.close()
    again = CliRunner().invoke(app, [*start, "--resume"])
    assert again.exit_code == 2, again.output
    assert (
        f"cannot resume {out} with --backend local (the default): it was started with "
        "--backend celery; give --backend celery and the --broker it was started with"
    ) in " ".join(again.output.split())


def test_a_goals_minimum_on_anthropic_holds_its_tool_use_system_prompt() -> None:
    # A plan comes back through a tool, so Anthropic adds its tool-use system prompt (313 tokens
    # with the tool forced, 346 offered: the minimum takes the smaller).
    from hierplan.batch.budget import goal_minimum
    from hierplan.core.settings import RunSettings
    from hierplan.pricing import PriceTable

    def minimum(model: str) -> int:
        (goal,) = parse_goals(json.dumps({"goal": "count the rows", "model": model}))
        return goal_minimum(goal, "sim", PriceTable(), RunSettings())[0]

    assert minimum("anthropic:claude-haiku-4-5") == minimum("openai:gpt-5-mini") + 313
    assert minimum("anthropic:claude-3-5-haiku") == minimum("openai:gpt-5-mini") + 264


def test_a_goals_minimum_counts_the_tool_specs_its_planning_prompt_lists() -> None:
    # The root's first planning call lists every tool of the run with its schema: a suite
    # task's minimum is that call's input, as the run sends it, plus the floor of its output.
    import hierplan
    from hierplan.batch.budget import goal_minimum
    from hierplan.errors import UnexpectedModelCall
    from hierplan.models.scripted import ScriptedModel
    from hierplan.models.tokens import estimate_request_tokens
    from hierplan.pricing import PriceTable

    (goal,) = parse_goals(json.dumps({"suite": "game24", "task": 0}))
    run_settings = RunSettings()
    tokens, _ = goal_minimum(goal, "sim", PriceTable(), run_settings)
    suite = get_suite("game24")
    env = suite.environment(suite.generate(1, 0)[0], latency_scale=0)
    assert env.tools and goal.spec.known_tools() == tuple(t.spec for t in env.tools)
    model = ScriptedModel([])  # records the first request, then stops the run
    with pytest.raises(UnexpectedModelCall):
        hierplan.run_sync(env.goal, model=model, tools=env.tools)
    (first,) = model.requests
    assert tokens == estimate_request_tokens(first) + math.ceil(
        run_settings.planner_max_tokens * DEFAULT_MIN_OUTPUT_FRACTION
    )


def test_batch_set_gives_every_goal_a_run_setting_that_a_line_overrides(tmp_path: Path) -> None:
    goals = tmp_path / "goals.jsonl"
    goals.write_text(
        '{"suite": "game24", "task": 0, "id": "plain"}\n'
        '{"suite": "game24", "task": 1, "id": "own", "executor_max_tokens": 4096}\n'
    )
    out = tmp_path / "out"
    start = ["batch", str(goals), "--out", str(out), "--sim-latency-scale", "0"]
    sets = ["--set", "executor_max_tokens=2048", "--set", "concurrency=2"]
    first = CliRunner().invoke(app, [*start, *sets])
    assert first.exit_code == 0, first.output

    def settings(goal: str) -> tuple[int, int]:
        record = json.loads((out / "goals" / goal / "run.json").read_text())
        return record["settings"]["executor_max_tokens"], record["settings"]["concurrency"]

    assert settings("plain") == (2048, 2) and settings("own") == (4096, 2)
    # the batch keeps its settings: a resume with others is refused, with the same ones runs
    again = CliRunner().invoke(app, [*start, "--resume", "--set", "executor_max_tokens=1024"])
    assert again.exit_code == 2 and "with --set" in " ".join(again.output.split())
    same = CliRunner().invoke(app, [*start, "--resume", *sets])
    assert same.exit_code == 0, same.output
    refused = CliRunner().invoke(app, [*start, "--set", "seed=3"])
    assert refused.output.strip() == "error: --set seed: use --seed"


def test_a_batch_takes_the_model_flags_of_run_and_keeps_them_for_its_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--base-url, --timeout, --price-in and --price-out: an unpriced model on a local
    OpenAI-compatible server, under a USD budget, priced by the flags."""
    from wire import TEST_KEY, OracleBackend, WireServer

    monkeypatch.setenv("OPENAI_API_KEY", TEST_KEY)
    goals = tmp_path / "goals.jsonl"
    goals.write_text('{"suite": "game24", "task": 0}\n{"suite": "game24", "task": 1}\n')
    out = tmp_path / "out"
    with WireServer(OracleBackend(get_suite("game24").oracle())) as server:
        url = server.base_url("openai")
        start = ["batch", str(goals), "--out", str(out), "--model", "openai:local-model"]
        start += ["--budget-usd", "1", "--sim-latency-scale", "0"]
        flags = ["--base-url", url, "--timeout", "5", "--price-in", "1", "--price-out", "2"]
        unpriced = CliRunner().invoke(app, [*start, "--base-url", url])
        assert unpriced.exit_code == 2 and "--price-in/--price-out" in unpriced.output
        assert not out.exists()
        first = CliRunner().invoke(app, [*start, *flags])
        hits = server.count()
    assert first.exit_code == 0, first.output
    assert hits > 0  # every call went to the server named by --base-url
    journal = open_journal(out, resume=True)
    options = journal.meta()["options"]
    journal.close()
    assert (options["base_url"], options["timeout"]) == (url, 5.0)
    assert (options["price_in"], options["price_out"]) == (1.0, 2.0)
    for goal in ("line-1", "line-2"):
        record = RunResult.load(out / "goals" / goal / "run.json")
        calls = [call for node in record.nodes() for call in node.calls]
        expected = sum(c.usage.input_tokens * 1 + c.usage.output_tokens * 2 for c in calls)
        assert record.totals()["cost_usd"] == pytest.approx(expected / 1e6)
    changed = CliRunner().invoke(app, [*start, "--resume", "--price-in", "3", "--timeout", "9"])
    assert changed.exit_code == 2
    assert f"cannot resume {out} with --timeout, --price-in" in " ".join(changed.output.split())
    same = CliRunner().invoke(app, [*start, "--resume"])  # the journal's flags, unrepeated
    assert same.exit_code == 0, same.output


def test_batch_model_flags_are_checked_before_anything_is_written(tmp_path: Path) -> None:
    goals = tmp_path / "goals.jsonl"
    goals.write_text('{"suite": "game24", "task": 0}\n')
    out = tmp_path / "out"
    start = ["batch", str(goals), "--out", str(out)]
    for flags, expected in (
        (["--base-url", "localhost:8000"], "--base-url 'localhost:8000' is not a URL"),
        (["--timeout", "5"], "apply to real models"),
        (["--price-in", "1"], "give both --price-in and --price-out"),
    ):
        result = CliRunner().invoke(app, [*start, *flags])
        assert result.exit_code == 2, result.output
        assert expected in " ".join(result.output.split()) and "Traceback" not in result.output
        assert not out.exists()


@pytest.fixture(scope="module")
def finished_batch(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A finished two-goal batch: its goals file and its directory (copy it to damage it)."""
    where = tmp_path_factory.mktemp("finished")
    goals = where / "goals.jsonl"
    goals.write_text('{"suite": "game24", "task": 0}\n{"suite": "game24", "task": 1}\n')
    out = where / "out"
    result = CliRunner().invoke(
        app, ["batch", str(goals), "--out", str(out), "--sim-latency-scale", "0"]
    )
    assert result.exit_code == 0, result.output
    return goals, out


def _damage_sql(statement: str) -> Any:
    def damage(path: Path) -> None:
        import sqlite3

        db = sqlite3.connect(path)
        db.execute(statement)
        db.commit()
        db.close()

    return damage


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda p: p.write_bytes(b"not a database, just text\n" * 100), "file is not a database"),
        (lambda p: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2]), "malformed"),
        (lambda p: p.write_bytes(b""), "it is empty"),
        (_damage_sql("DELETE FROM goals WHERE position = 1"), "it holds 1 goal(s) where"),
        (_damage_sql("DELETE FROM goals WHERE position = 0"), "goal row 1 ('line-2') is out"),
        (_damage_sql("DELETE FROM goals"), "it holds no goals"),
        (_damage_sql("DELETE FROM meta WHERE key = 'options'"), "it lacks the batch's options"),
        (_damage_sql("UPDATE meta SET value = '{\"tok' WHERE key = 'budget'"), "'budget' is not"),
        (_damage_sql("UPDATE meta SET value = '{\"x\": 1}' WHERE key = 'options'"), "options"),
        (_damage_sql("UPDATE goals SET state = 'bogus' WHERE position = 1"), "no known state"),
        (_damage_sql("UPDATE goals SET goal = '{\"id\"' WHERE position = 1"), "goal row 2"),
        (_damage_sql("DROP TABLE goals"), "no such table: goals"),
        # Amounts: each kind of bad one, named with its goal and field (not a traceback, not a
        # spend that a negative or text amount lowers).
        (
            _damage_sql(f"UPDATE goals SET spent_pico = {2**63 - 1} WHERE position = 0"),
            "goal row 1 ('line-1') has spent_pico 9,223,372,036,854,775,807, which takes the "
            "batch's spend past the 9,223,372,036,854,775,807 pico-dollars",
        ),
        (
            _damage_sql("UPDATE goals SET spent_pico = -5 WHERE position = 1"),
            "goal row 2 ('line-2') has spent_pico -5, not a whole number of pico-dollars >= 0",
        ),
        (
            _damage_sql("UPDATE goals SET spent_pico = 'lots' WHERE position = 1"),
            "goal row 2 ('line-2') has spent_pico 'lots', not a whole number",
        ),
        (
            _damage_sql("UPDATE goals SET prior_tokens = 2.5 WHERE position = 1"),
            "goal row 2 ('line-2') has prior_tokens 2.5, not a whole number of tokens >= 0",
        ),
        (
            _damage_sql("UPDATE goals SET held_pico = x'00' WHERE position = 0"),
            "goal row 1 ('line-1') has held_pico b'\\x00', not a whole number",
        ),
        (
            _damage_sql("UPDATE goals SET attempts = 'twice' WHERE position = 0"),
            "goal row 1 ('line-1') has attempts 'twice', not a whole number of attempts",
        ),
        (
            _damage_sql(
                "UPDATE meta SET value = json_set(value, '$.pico', '5') WHERE key = 'budget'"
            ),
            "its budget's pico '5' is not a batch's",
        ),
    ],
)
def test_a_damaged_batch_journal_is_refused_naming_the_file_and_what_is_wrong(
    finished_batch: tuple[Path, Path], tmp_path: Path, damage: Any, problem: str
) -> None:
    """Never a traceback, and never a false "all done" from a journal that lost its goals;
    the damaged journal is left as it was."""
    goals, finished = finished_batch
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    journal = out / "journal.sqlite"
    damage(journal)
    before = journal.read_bytes()
    result = CliRunner().invoke(app, ["batch", str(goals), "--out", str(out), "--resume"])
    text = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert text.startswith(f"error: the batch journal {journal} is damaged ("), text
    assert problem in text and "Traceback" not in text
    assert "with another --out" in text
    assert journal.read_bytes() == before


def test_a_goal_out_of_budget_names_where_a_batch_sets_a_goals_budget(tmp_path: Path) -> None:
    # Above the least a goal is checked for before the batch starts, and too small for the
    # replan a failed step of its plan needs.
    goals = tmp_path / "goals.jsonl"
    goals.write_text('{"scenario": "data_migration", "budget_usd": 0.0018, "id": "small"}\n')
    out = tmp_path / "out"
    args = ["batch", str(goals), "--out", str(out), "--budget-usd", "1", "--sim-latency-scale", "0"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1, result.output
    (row,) = Journal(out / "journal.sqlite").rows()
    assert row.state == "failed" and "is out of budget" in (row.reason or "")
    # Not a run's --budget-usd, which a batch's goal does not take.
    assert "give the run a larger budget with the goal's budget_tokens / budget_usd, or " in (
        row.reason or ""
    )
    assert "--goal-budget-tokens / --goal-budget-usd" in (row.reason or "")
    assert "in the library" not in (row.reason or "")
