"""The CLI: runs, views, validation, and clear one-line errors with exit status 2."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from hierplan.cli import app
from hierplan.cli.options import SETTING_FLAGS
from hierplan.runner.goals import GOAL_FILE_KEYS, settings_from_assignments

runner = CliRunner()
FAST = ["--sim-latency-scale", "0"]


def hierplan(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hierplan", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
    )


def test_run_a_scenario_writes_run_json_and_view_shows_it(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = runner.invoke(
        app, ["run", "--scenario", "data_migration", "--yes", "--out", str(out), *FAST]
    )
    assert result.exit_code == 0, result.output
    assert "SIMULATED" in result.output and "Cost per level" in result.output
    record = json.loads((out / "run.json").read_text())
    assert record["status"] == "succeeded" and record["simulated"] is True
    assert record["tree"]["path"] == "1" and record["verification"]["ok"] is True
    assert {
        "input_tokens",
        "output_tokens",
        "calls",
        "cost_usd",
        "planning_cost_usd",
        "execution_cost_usd",
    } <= set(record["totals"])
    assert [row["depth"] for row in record["levels"]] == [1, 2, 3]
    view = runner.invoke(app, ["view", str(out / "run.json")])
    assert view.exit_code == 0
    assert "1.7 planner succeeded" in view.output and "planning $" in view.output
    # saved again by an editor that puts a byte-order mark in front
    marked = tmp_path / "marked.json"
    marked.write_bytes(b"\xef\xbb\xbf" + (out / "run.json").read_bytes())
    again = runner.invoke(app, ["view", str(marked)])
    assert again.exit_code == 0 and again.output == view.output.replace(
        str(out / "run.json"), str(marked)
    )


def test_a_demo_with_a_bad_trace_target_prints_the_error_alone(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    result = hierplan("demo", "--out", str(out), "--trace", "bogus")
    assert result.returncode == 2
    assert result.stdout == ""  # no banner for a demo that does not start
    assert result.stderr.strip() == (
        "error: unknown --trace target 'bogus': use console, otlp, otlp=URL or jsonl=PATH"
    )
    assert not out.exists()


def test_a_collector_that_cannot_be_reached_is_one_warning_line(tmp_path: Path) -> None:
    env = {**os.environ, "OTEL_EXPORTER_OTLP_TIMEOUT": "2", "OTEL_METRICS_EXPORTER": "none"}
    result = subprocess.run(
        [sys.executable, "-m", "hierplan", "run", "--scenario", "data_migration", "--yes",
         "--out", str(tmp_path / "run"), *FAST, "--trace", "otlp=http://127.0.0.1:1"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("warning: the trace could not be exported"), lines[0]
    assert "run goes on without it" in lines[0]


def test_a_missing_api_key_says_what_to_set_from_the_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    out = tmp_path / "run"
    model = "anthropic:claude-haiku-4-5"
    result = runner.invoke(
        app, ["run", "--scenario", "data_migration", "-m", model, "-y", "-o", str(out)]
    )
    assert result.exit_code == 2
    assert result.output.strip() == (
        f"error: {model} needs an API key: set ANTHROPIC_API_KEY (a local server that ignores "
        "keys takes any value), or, from Python, pass api_key in model_options"
    )
    assert not out.exists()


@pytest.mark.parametrize(
    "args",
    [
        ["--scenario", "nope"],
        ["do something"],  # free text for the simulator
        ["--scenario", "data_migration", "-m", "anthropic:claude-haiku-4-5"],  # no API key
    ],
)
@pytest.mark.parametrize("runs_existed", [False, True])
def test_a_refused_run_without_out_leaves_no_directory_behind(
    tmp_path: Path, args: list[str], runs_existed: bool
) -> None:
    """Without --out a run makes runs/<time> before it starts: a run refused then left it
    there, empty (and runs/ with it)."""
    env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}
    if runs_existed:
        (tmp_path / "runs").mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "hierplan", "run", *args, "--yes"],
        cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: ")
    assert [p.name for p in tmp_path.iterdir()] == (["runs"] if runs_existed else [])
    if runs_existed:
        assert not any((tmp_path / "runs").iterdir())


def test_a_broken_yaml_plan_names_the_problem_and_where_it_is(tmp_path: Path) -> None:
    broken = tmp_path / "plan.yaml"
    broken.write_text("goal: g\nsteps:\n  - id: a\n   title: x\n")
    result = runner.invoke(app, ["validate", str(broken)])
    assert result.exit_code == 2
    assert result.output.strip() == (
        f"error: plan file {broken} is not valid YAML/JSON: expected <block end>, but found "
        "'<block mapping start>' (line 4, column 4)"
    )


def test_a_run_record_given_as_a_plan_is_named_as_such(tmp_path: Path) -> None:
    record = tmp_path / "run.json"
    record.write_text(json.dumps({"run_id": "r", "tree": {}, "status": "succeeded"}))
    result = runner.invoke(app, ["validate", str(record)])
    assert result.exit_code == 2
    assert result.output.strip() == (
        f"error: plan file {record} is a run record, not a plan: give a file with a plan's "
        f"'goal' and 'steps' (hierplan view {record} shows the run)"
    )


def test_view_shows_a_answer_of_several_lines_line_by_line(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = runner.invoke(
        app, ["run", "--scenario", "data_migration", "--yes", "--out", str(out), *FAST]
    )
    assert result.exit_code == 0, result.output
    record = json.loads((out / "run.json").read_text())
    record["answer"] = "first: 5 tables match\nsecond: 2 tables match\n\nthird: ok"
    (out / "run.json").write_text(json.dumps(record))
    view = CliRunner().invoke(app, ["view", str(out / "run.json")], terminal_width=200)
    assert view.exit_code == 0, view.output
    tail = view.output[view.output.index("answer:") :].splitlines()
    assert tail[:4] == [
        "answer:",
        "  first: 5 tables match",
        "  second: 2 tables match",
        "  third: ok",
    ], tail


def test_a_bad_option_is_one_line_that_points_to_help() -> None:
    cases = [
        (["run", "--scenario", "data_migration", "--bogus"], "No such option: --bogus"),
        (["run", "--timeout", "0", "--yes"], "Invalid value for '--timeout'"),
        (["view"], "Missing argument"),
        (["frobnicate"], "No such command 'frobnicate'"),
    ]
    for args, message in cases:
        proc = hierplan(*args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert proc.stdout == "", (args, proc.stdout)
        lines = proc.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (args, proc.stderr)
        assert message in lines[0] and "--help" in lines[0], (args, lines[0])
    # help, the version and no arguments at all are unchanged
    assert hierplan("--version").stdout.startswith("hierplan ")
    assert "Usage:" in hierplan().stdout
    assert hierplan("view", "--help").returncode == 0


def test_help_names_what_a_trace_option_takes_not_its_python_type() -> None:
    for command in (["run"], ["resume"], ["batch"], ["worker"]):
        shown = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "200"}).output
        assert re.search(r"--trace\s+TARGET\b", shown), (command, shown)
        assert "list[str]" not in shown, command


def test_help_at_80_columns_shows_every_option_whole_with_what_it_takes() -> None:
    import typer.core
    import typer.main

    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    for name, command in group.commands.items():
        shown = CliRunner().invoke(app, [name, "--help"], env={"COLUMNS": "80"}).output
        lines = shown.splitlines()
        assert all(len(line) <= 80 for line in lines), (name, shown)
        assert "<bool>" not in shown and "…" not in shown, (name, shown)
        for param in command.params:
            if not isinstance(param, typer.core.TyperOption):
                continue
            # Each option's line starts with its names, then what it takes (a flag takes nothing).
            names = ", ".join(sorted(param.opts, key=len))
            if param.secondary_opts:
                names += " / " + ", ".join(param.secondary_opts)
            takes = param.metavar or param.display_type(click_context(command))
            metavar = "" if param.is_flag else f" {takes}"
            listed = [line.strip() for line in lines if line.strip().startswith(names)]
            assert any(
                line == f"{names}{metavar}" or line.startswith(f"{names}{metavar}  ")
                for line in listed
            ), (name, param.opts, shown)


def click_context(command: Any) -> Any:
    """A context of ``command``, as its help is shown in."""
    return command.make_context(command.name, ["--help"], resilient_parsing=True)


def test_bad_input_exits_2_with_one_line_and_no_traceback(tmp_path: Path) -> None:
    broken = tmp_path / "goal.yaml"
    broken.write_text("goal: [unclosed\n")
    wrong_field = tmp_path / "goal2.yaml"
    wrong_field.write_text("goal: hi\nstratgy: dag\n")
    garbage = tmp_path / "run.json"
    garbage.write_text("{}")
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    deep_yaml = tmp_path / "deep.yaml"
    deep_yaml.write_text("[" * 100_000 + "]" * 100_000)
    digits = tmp_path / "digits.yaml"
    digits.write_text("goal: g\nsteps: []\nx: " + "7" * 5000 + "\n")
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing here\n")
    shouting = tmp_path / "GOAL.TXT"
    shouting.write_text("plan my wedding\n")
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe\x00")
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    goals = tmp_path / "goals.jsonl"
    goals.write_text('{"scenario": "data_migration"}\n')
    cases = [
        (["run", "--goal-file", str(broken), "--yes"], "not valid YAML/JSON"),
        (
            ["run", "--goal-file", str(wrong_field), "--yes"],
            "unknown key 'stratgy': the keys allowed are goal, scenario, strategy,",
        ),
        (
            ["run", "--scenario", "nope", "--yes"],
            "unknown scenario 'nope': choose one of data_migration",
        ),
        (
            ["run", "--scenario", "data_migration", "--strategy", "yolo", "--yes"],
            "unknown strategy 'yolo'",
        ),
        (["run", "plan my wedding", "--yes"], "is free text"),
        (["run", "hi", "--model", "gpt-4", "--yes"], "unknown model 'gpt-4'"),
        (
            [
                "run",
                "Migrate it",
                "--scenario",
                "data_migration",
                "--yes",
                "-o",
                str(tmp_path / "x"),
            ],
            "a goal and a scenario were both given, but the simulator knows only",
        ),
        (["run", "--scenario", "data_migration"], "pass --yes"),
        (["run"], "no goal"),
        (["view", str(garbage)], "is not a hierplan run record"),
        (["view", str(tmp_path / "missing.json")], "cannot read"),
        (["demo", "--sim-profile", "sloppy"], "unknown simulator profile 'sloppy'"),
        (["run", "--goal-file", str(deep), "--yes"], f"goal file {deep} is nested too deeply"),
        (["validate", str(deep_yaml)], "is nested too deeply to read"),
        (["validate", str(digits)], "holds a number with too many digits"),
        (["run", "--goal-file", str(empty), "--yes"], f"goal file {empty} is empty"),
        (["run", "--goal-file", str(shouting), "--yes"], "is free text"),  # read as text
        (["view", str(binary)], "is not a hierplan run record: not UTF-8 text"),
        (
            ["run", "--scenario", "data_migration", "--yes", "-o", str(a_file / "sub")],
            f"cannot create the run directory {a_file / 'sub'}: {a_file} is a file",
        ),
        (
            ["run", "--scenario", "data_migration", "--yes", "--budget-usd", "1e300"],
            "a USD budget must be a finite number from 0 to 1,000,000,000, not 1e+300",
        ),
        (
            ["batch", str(goals), "--out", str(tmp_path / "b"), "--goal-budget-usd", "inf"],
            "a USD budget must be a finite number from 0 to 1,000,000,000, not inf",
        ),
        (
            ["batch", str(goals), "--out", str(a_file), "--sim-latency-scale", "0"],
            f"cannot create the batch directory {a_file}: {a_file} is a file",
        ),
    ]
    for args, message in cases:
        proc = hierplan(*args, cwd=tmp_path)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr + proc.stdout
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], (
            args,
            proc.stderr,
        )


def test_an_invalid_plan_from_the_model_is_replanned_not_a_crash(tmp_path: Path) -> None:
    """With a noisy simulator the model's plans break; the run goes on and stays truthful."""
    result = runner.invoke(
        app,
        [
            "run",
            "--scenario",
            "data_migration",
            "--yes",
            "--out",
            str(tmp_path),
            "--sim-profile",
            "weak",
            "--seed",
            "3",
            *FAST,
        ],
    )
    record = json.loads((tmp_path / "run.json").read_text())
    flags = [f for node in _walk(record["tree"]) for call in node["calls"] for f in call["flags"]]
    assert any(f.startswith("sim_plan_error") or f.startswith("sim_executor_error") for f in flags)
    assert result.exit_code == (
        0 if record["status"] == "succeeded" and record["verification"]["ok"] else 1
    )


def _walk(node: dict[str, Any]) -> list[dict[str, Any]]:
    out = [node]
    for child in node["children"]:
        out.extend(_walk(child))
    return out


def test_validate_command(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(
        "goal: g\nsteps:\n  - {id: a, title: A, instruction: do a}\n"
        "  - {id: b, title: B, instruction: do b, depends_on: [a], tool: copy}\n"
    )
    assert runner.invoke(app, ["validate", str(good), "--tools", "copy"]).exit_code == 0
    bad = runner.invoke(app, ["validate", str(good), "--tools", "other"])
    assert bad.exit_code == 1 and "uses tool 'copy'" in bad.output


def test_validate_without_tools_says_the_plans_tools_were_not_checked(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "goal: g\nsteps:\n  - {id: a, title: A, instruction: do a, tool: cpoy}\n"
        "  - {id: b, title: B, instruction: do b, depends_on: [a], tools: [zip, copy]}\n"
    )
    result = runner.invoke(app, ["validate", str(plan)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "plan is valid, but its tools were not checked (copy, cpoy, zip)" in text
    assert "--tools a,b" in text
    # a plan that names no tool has nothing left unchecked
    plain = tmp_path / "plain.yaml"
    plain.write_text("goal: g\nsteps:\n  - {id: a, title: A, instruction: do a}\n")
    shown = runner.invoke(app, ["validate", str(plain)]).output
    assert "plan is valid" in shown and "not checked" not in shown


def test_validate_refuses_a_reference_to_a_step_it_does_not_depend_on(tmp_path: Path) -> None:
    # The run's gate refuses this plan: validate must not call it valid.
    plan = tmp_path / "p9.yaml"
    plan.write_text(
        "goal: g\nsteps:\n"
        "- {id: x, title: x, instruction: x, tool: add, args: {a: 1, b: 2}}\n"
        '- {id: t, title: t, instruction: t, tool: add, args: {a: "$x", b: 1}}\n'
    )
    result = runner.invoke(app, ["validate", str(plan), "--tools", "add"])
    assert result.exit_code == 1, result.output
    assert "problem: step 't' uses $x but does not depend on 'x'" in result.output
    assert "plan is valid" not in result.output


def test_validate_names_a_cycle_by_links_the_plan_has(tmp_path: Path) -> None:
    plan = tmp_path / "cyc3.yaml"
    plan.write_text(
        "goal: g\nsteps:\n"
        "- {id: a, title: a, instruction: a, depends_on: [d]}\n"
        "- {id: b, title: b, instruction: b, depends_on: [a]}\n"
        "- {id: c, title: c, instruction: c, depends_on: [a]}\n"
        "- {id: d, title: d, instruction: d, depends_on: [b, c]}\n"
    )
    result = runner.invoke(app, ["validate", str(plan)], env={"COLUMNS": "200"})
    assert result.exit_code == 1, result.output
    text = " ".join(result.output.split())
    # b does not depend on c (nor c on b): the old message said "a -> b -> c -> d -> a"
    assert "problem: dependency cycle among steps: a -> b -> d -> a" in text
    assert "b -> c" not in text


@pytest.mark.parametrize("command", [["validate"], ["run", "--goal-file"]])
def test_a_plan_or_goal_file_too_large_or_without_end_is_refused_not_read_forever(
    command: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hierplan import files as plan_module

    result = runner.invoke(app, [*command, "/dev/zero"], env={"COLUMNS": "300"})
    assert result.exit_code == 2, result.output
    assert "file /dev/zero is not a regular file" in " ".join(result.output.split())
    big = tmp_path / "big.yaml"
    big.write_text("goal: g\nsteps: []\n# " + "x" * 2_000)
    monkeypatch.setattr(plan_module, "MAX_TEXT_FILE_BYTES", 1_000)
    result = runner.invoke(app, [*command, str(big)], env={"COLUMNS": "300"})
    assert result.exit_code == 2, result.output
    message = " ".join(result.output.split())
    assert f"file {big} is larger than 1,000 bytes" in message
    assert "check that it is the file you meant" in message and "Traceback" not in message


def test_a_simulated_model_of_no_known_price_is_warned_about(tmp_path: Path) -> None:
    # A free-text goal: the simulator refuses it at once, after the warning was given.
    args = ["run", "Greet the user", "-y", "--sim-latency-scale", "0"]
    result = runner.invoke(app, [*args, "--model", "sim:unknown-model", "-o", str(tmp_path / "a")])
    text = " ".join(result.output.split())
    said = "warning: sim:unknown-model is simulated as 'unknown-model', which has no known price"
    assert said in text, text
    assert "--price-in/--price-out" in text and "sim:openai:gpt-5-mini" in text
    prices = ["--price-in", "1", "--price-out", "2"]
    for priced in (["--model", "sim:openai:gpt-5-mini"], ["--model", "sim:x", *prices]):
        quiet = runner.invoke(app, [*args, *priced, "-o", str(tmp_path / priced[1])])
        assert "no known price" not in quiet.output and "Traceback" not in quiet.output


def test_scenarios_command() -> None:
    result = runner.invoke(app, ["scenarios"])
    assert result.exit_code == 0 and "data_migration" in result.output


def test_version_prints_the_installed_distributions_version() -> None:
    from importlib.metadata import version

    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output == f"hierplan {version('hierplan')}\n"


def test_demo_in_a_subprocess(tmp_path: Path) -> None:
    # What an earlier demo left (its record, reduced to what says whose it is) is replaced.
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "run.json").write_text('{"scenario": "data_migration"}')
    proc = hierplan("demo", "--out", str(tmp_path / "demo"), *FAST, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "demo" / "run.json").read_text())["status"] == "succeeded"
    assert "verified: 14/14 tables match the source" in proc.stdout
    assert "peak leaves running at once" in proc.stdout


def test_a_run_record_that_cannot_be_written_is_reported_after_the_run_is_shown(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    (out / "run.json").mkdir(parents=True)  # a directory where the record should go
    args = ["run", "--scenario", "data_migration", "--yes", "--sim-latency-scale", "0"]
    proc = hierplan(*args, "--sim-profile", "ideal", "-o", str(out), cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert "verified: 14/14 tables match the source" in proc.stdout  # the run is still shown
    assert f"error: the run record could not be written to {out / 'run.json'}" in proc.stderr


def test_flags_that_cannot_work_are_refused_before_anything_runs(tmp_path: Path) -> None:
    from rich.console import Console

    from hierplan.cli.run import model_choice
    from hierplan.errors import UserInputError
    from hierplan.review.console import ConsoleReviewer
    from hierplan.runner.spec import ModelSpec

    with pytest.raises(UserInputError, match="--base-url 'notaurl' is not a URL"):
        model_choice("openai:gpt-5-mini", base_url="notaurl")
    given = model_choice("openai:gpt-5-mini", base_url="http://localhost:8000/v1")
    assert isinstance(given, ModelSpec)
    assert given.adapter_options() == {"base_url": "http://localhost:8000/v1"}
    # An editor setting that is no command is discarded with a message, not a crash.
    for setting in ('"my editor', "   "):
        assert ConsoleReviewer(Console(), editor=setting).editor_command() == []
    proc = hierplan("bench", "--suite", "game24", "--max-depth", "0", cwd=tmp_path)
    assert proc.returncode == 2 and "--max-depth" in proc.stderr
    assert not any(tmp_path.iterdir())


def test_the_simulator_is_labelled_whatever_the_case_of_its_name(tmp_path: Path) -> None:
    args = ["run", "--scenario", "data_migration", "--yes", "--sim-latency-scale", "0"]
    proc = hierplan(*args, "--model", "SIM", "-o", str(tmp_path / "out"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "plan for node 1 [SIMULATED]" in proc.stdout


def _signal_mid_run(
    args: list[str], started: Path, sig: signal.Signals, cwd: Path, after_s: float = 1.0
) -> tuple[int, str, str]:
    """Run ``hierplan ARGS``, send ``sig`` once ``started`` exists and ``after_s`` has passed."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "hierplan", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.1)  # the run has started once its scenario is set up
    time.sleep(after_s)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=60)
    return proc.returncode, stdout, stderr


@pytest.mark.parametrize(
    ("command", "sig", "code", "reason"),
    [
        (
            ["run", "--scenario", "data_migration", "--yes"],
            signal.SIGINT,
            130,
            "interrupted (Ctrl-C)",
        ),
        (
            ["run", "--scenario", "data_migration", "--yes"],
            signal.SIGTERM,
            143,
            "stopped by SIGTERM",
        ),
        (["demo", "--sim-latency-scale", "1"], signal.SIGTERM, 143, "stopped by SIGTERM"),
    ],
)
def test_ctrl_c_or_sigterm_cancels_the_run_and_keeps_its_record(
    tmp_path: Path, command: list[str], sig: signal.Signals, code: int, reason: str
) -> None:
    from hierplan.durable.lock import RUN_LOCK, holding_run_directory

    out = tmp_path / "out"
    returncode, stdout, stderr = _signal_mid_run(
        [*command, "-o", str(out)], out / "source.db", sig, tmp_path
    )
    assert returncode == code, stderr
    assert "Traceback" not in stdout + stderr
    assert f"{reason}: the run was cancelled" in stdout
    record = json.loads((out / "run.json").read_text())
    assert record["status"] == "cancelled"
    assert not (out / RUN_LOCK).exists()
    with holding_run_directory(out):  # nothing holds the directory any more
        pass


@pytest.mark.parametrize(
    ("sig", "code", "reason"),
    [(signal.SIGINT, 130, "interrupted (Ctrl-C)"), (signal.SIGTERM, 143, "stopped by SIGTERM")],
)
def test_a_signal_while_the_scenario_sets_up_cancels_the_run_and_keeps_its_record(
    tmp_path: Path, sig: signal.Signals, code: int, reason: str
) -> None:
    """The scenario builds its database for a second or two before the run starts. A Ctrl-C
    then used to be left to the event loop, which let the run go on to its end and threw its
    record away; a SIGTERM ended the process with no word and a half-written database."""
    from hierplan.durable.lock import RUN_LOCK

    out = tmp_path / "out"
    building = out / "source.db.tmp"
    returncode, stdout, stderr = _signal_mid_run(
        ["run", "--scenario", "data_migration", "--yes", "-o", str(out)], building, sig, tmp_path, 0
    )
    assert returncode == code, stderr
    assert "Traceback" not in stdout + stderr
    assert f"{reason}: the run was cancelled" in stdout
    record = json.loads((out / "run.json").read_text())
    assert record["status"] == "cancelled"
    assert not building.exists() and not (out / RUN_LOCK).exists()


def test_a_goal_file_with_a_blank_goal_or_an_empty_scenario_is_refused(tmp_path: Path) -> None:
    from hierplan.errors import UserInputError
    from hierplan.runner.goals import load_goal_file

    blank = tmp_path / "blank.yaml"
    blank.write_text('goal: "   "\nmodel: openai:gpt-5-mini\n')
    with pytest.raises(UserInputError, match="'goal' is blank: write the goal"):
        load_goal_file(blank)
    empty = tmp_path / "empty.yaml"
    empty.write_text('scenario: ""\n')
    with pytest.raises(UserInputError, match="scenario: String should have at least 1 character"):
        load_goal_file(empty)


def test_a_goal_file_takes_as_long_a_goal_as_a_run_does(tmp_path: Path) -> None:
    from hierplan.errors import UserInputError
    from hierplan.runner.goals import load_goal_file

    long_goal = "migrate the shop " * 2_000  # 34,000 characters: the run takes 100,000
    path = tmp_path / "goal.txt"
    path.write_text(long_goal)
    assert load_goal_file(path).goal == long_goal.strip()
    path.write_text("x" * 100_001)
    with pytest.raises(UserInputError, match="goal: String should have at most 100000"):
        load_goal_file(path)


def test_every_option_of_every_command_says_what_it_does() -> None:
    import typer.core
    import typer.main

    command = typer.main.get_command(app)
    assert isinstance(command, typer.core.TyperGroup)
    silent = [
        f"hierplan {name} {param.opts[0]}"
        for name, sub in command.commands.items()
        for param in sub.params
        if param.name != "help" and not getattr(param, "help", None)
    ]
    assert silent == [], f"options without a help text: {silent}"


def test_view_takes_a_run_directory_as_well_as_its_run_json(tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = runner.invoke(
        app, ["run", "--scenario", "data_migration", "--yes", "--out", str(out), *FAST]
    )
    assert done.exit_code == 0, done.output
    by_file = runner.invoke(app, ["view", str(out / "run.json")])
    by_dir = runner.invoke(app, ["view", str(out)])
    assert by_dir.exit_code == 0, by_dir.output
    assert by_dir.output == by_file.output
    empty = tmp_path / "empty"
    empty.mkdir()
    refused = runner.invoke(app, ["view", str(empty)])
    assert refused.exit_code == 2
    assert f"{empty} holds no run.json" in " ".join(refused.output.split())


def test_a_flag_on_the_command_line_wins_over_the_goal_file(tmp_path: Path) -> None:
    spec = tmp_path / "goal.yaml"
    spec.write_text("scenario: data_migration\nstrategy: dag\nconcurrency: 4\nseed: 7\n")
    settings = {}
    for name, flags in {"file": [], "flags": ["--concurrency", "2", "-s", "hierarchical"]}.items():
        out = tmp_path / name
        # The ideal profile: whether the seeded run succeeds is not what this tests.
        args = ["run", "--goal-file", str(spec), "--yes", "-o", str(out), *FAST, *flags,
                "--sim-profile", "ideal"]  # fmt: skip
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
        settings[name] = json.loads((out / "run.json").read_text())["settings"]
    # The file's settings win over the flags' defaults, the flags given over the file.
    assert (settings["file"]["strategy"], settings["file"]["concurrency"]) == ("dag", 4)
    assert (settings["flags"]["strategy"], settings["flags"]["concurrency"]) == ("hierarchical", 2)
    assert settings["file"]["seed"] == settings["flags"]["seed"] == 7


def test_a_goal_file_sets_any_run_setting_checked_as_run_settings_checks_it(
    tmp_path: Path,
) -> None:
    spec = tmp_path / "goal.yaml"
    spec.write_text(
        "scenario: data_migration\nexecutor_max_tokens: 4096\nstep_timeout_s: null\n"
        "max_retries: 0\n"
    )
    out = tmp_path / "run"
    result = runner.invoke(app, ["run", "--goal-file", str(spec), "-y", "-o", str(out), *FAST])
    assert result.exit_code == 0, result.output
    settings = json.loads((out / "run.json").read_text())["settings"]
    assert settings["executor_max_tokens"] == 4096 and settings["step_timeout_s"] is None
    assert settings["max_retries"] == 0
    # Problems of the goal's own keys and of the settings come together, each named.
    spec.write_text("scenario: data_migration\nmax_depth: 0\nexecutor_max_tokens: 2\nbogus: 1\n")
    result = runner.invoke(app, ["run", "--goal-file", str(spec), "-y", "-o", str(out), *FAST])
    assert result.exit_code == 2
    # An unknown key lists the keys allowed (it said only "Extra inputs are not permitted").
    assert result.output.strip() == (
        f"error: goal file {spec} is not a valid goal: unknown key 'bogus': the keys allowed are "
        f"{', '.join(GOAL_FILE_KEYS)}; max_depth: Input should be greater than or equal to 1; "
        "executor_max_tokens: Input should be greater than or equal to 16"
    )


def test_set_gives_any_run_setting_without_a_flag_of_its_own(tmp_path: Path) -> None:
    out = tmp_path / "run"
    sets = ["--set", "executor_max_tokens=2048", "--set", "step_timeout_s=null"]
    result = runner.invoke(
        app, ["run", "--scenario", "data_migration", "-y", "-o", str(out), *FAST, *sets]
    )
    assert result.exit_code == 0, result.output
    settings = json.loads((out / "run.json").read_text())["settings"]
    assert (settings["executor_max_tokens"], settings["step_timeout_s"]) == (2048, None)
    # --set wins over a goal file, as a flag does
    spec = tmp_path / "goal.yaml"
    spec.write_text("scenario: data_migration\nexecutor_max_tokens: 4096\nmax_retries: 1\n")
    out = tmp_path / "with-file"
    result = runner.invoke(
        app, ["run", "--goal-file", str(spec), "-y", "-o", str(out), *FAST, *sets]
    )
    assert result.exit_code == 0, result.output
    settings = json.loads((out / "run.json").read_text())["settings"]
    assert (settings["executor_max_tokens"], settings["max_retries"]) == (2048, 1)
    # Every problem at once, each named; a setting with a flag of its own goes by its flag.
    bad = ["--set", "concurrency=3", "--set", "x", "--set", "max_retries=-1"]
    result = runner.invoke(app, ["run", "--scenario", "data_migration", "-y", *FAST, *bad])
    assert result.exit_code == 2
    assert result.output.strip() == (
        "error: --set concurrency: use --concurrency; --set 'x': write KEY=VALUE, e.g. "
        "executor_max_tokens=4096"
    )
    result = runner.invoke(
        app, ["run", "--scenario", "data_migration", "-y", *FAST, "--set", "max_retries=-1"]
    )
    assert result.output.strip() == (
        "error: --set max_retries: Input should be greater than or equal to 0"
    )
    # No value of another type is converted: true is no count, a quoted number no number.
    loose = ["--set", "max_retries=true", "--set", "retry_backoff_s='0.5'"]
    result = runner.invoke(app, ["run", "--scenario", "data_migration", "-y", *FAST, *loose])
    assert result.exit_code == 2
    assert result.output.strip() == (
        "error: --set max_retries: Input should be a valid integer; "
        "--set retry_backoff_s: Input should be a valid number"
    )
    # A number with an exponent is a number, as in JSON (YAML 1.1 would read "1e3" as text).
    exponents = ["step_timeout_s=1e3", "retry_backoff_s=5e-1"]
    assert settings_from_assignments(exponents, flags=SETTING_FLAGS) == {
        "step_timeout_s": 1000.0,
        "retry_backoff_s": 0.5,
    }
    # Numbers as JSON and YAML 1.2 read them, not YAML 1.1: 010 is ten, not octal 8, and a
    # sexagesimal 1:30 or a 1_000 is text, which a number setting refuses.
    assert settings_from_assignments(["max_retries=010"], flags=SETTING_FLAGS) == {
        "max_retries": 10
    }
    for text in ("step_timeout_s=1:30", "max_retries=1_0"):
        name = text.split("=")[0]
        result = runner.invoke(
            app, ["run", "--scenario", "data_migration", "-y", *FAST, "--set", text]
        )
        assert result.exit_code == 2
        assert result.output.startswith(f"error: --set {name}: Input should be a valid")


def test_a_run_does_not_replace_an_earlier_run_unless_told_to(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["run", "--scenario", "data_migration", "--yes", "--out", str(out), *FAST]
    assert runner.invoke(app, args).exit_code == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    refused = runner.invoke(app, args)
    assert refused.exit_code == 2
    assert " ".join(refused.output.split()) == (
        f"error: {out} holds an earlier run (run.json, target.db) that this run would replace: "
        "give --overwrite to replace it, or give this run another --out"
    )
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    # A scenario's files without a record are an earlier run's too; the sample source is not.
    (out / "run.json").unlink()
    (out / "source.db").write_text("my own database")
    refused = runner.invoke(app, args)
    assert refused.exit_code == 2 and "(target.db, source.db)" in refused.output
    assert (out / "source.db").read_text() == "my own database"
    again = runner.invoke(app, [*args, "--overwrite"])
    assert again.exit_code == 0, again.output
    assert json.loads((out / "run.json").read_text())["status"] == "succeeded"
    # The demo replaces its own output, as it always has.
    demo = ["demo", "--out", str(out), *FAST]
    assert runner.invoke(app, demo).exit_code == 0


def test_resume_of_a_file_and_a_usd_budget_that_is_no_amount_are_refused_clearly(
    tmp_path: Path,
) -> None:
    record = tmp_path / "mig" / "run.json"
    record.parent.mkdir()
    record.write_text("{}")
    proc = hierplan("resume", str(record), "--approve", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == (
        f"error: {record} is a file: hierplan resume takes the paused run's directory (the "
        f"--out it ran with), e.g. {record.parent}"
    )
    args = ["run", "--scenario", "data_migration", "--yes", "-o", str(tmp_path / "out")]
    for amount in ("nan", "-1", "inf"):
        refused = runner.invoke(app, [*args, f"--budget-usd={amount}"])
        assert refused.exit_code == 2
        shown = " ".join(refused.output.split())
        assert f"give a number of USD, 0 or more (e.g. 0.5), not {amount}" in shown, shown
    assert not (tmp_path / "out").exists()


def test_runs_started_in_the_same_second_get_a_directory_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    strftime = time.strftime

    def same_second(form: str, *when: Any) -> str:
        return "20261204-120000" if form == "%Y%m%d-%H%M%S" else strftime(form, *when)

    monkeypatch.setattr(time, "strftime", same_second)
    for _ in range(2):
        result = runner.invoke(app, ["run", "--scenario", "data_migration", "--yes", *FAST])
        assert result.exit_code == 0, result.output
    runs = sorted(p.name for p in (tmp_path / "runs").iterdir() if p.name != "scenarios")
    assert runs == ["20261204-120000", "20261204-120000-2"]
    assert all((tmp_path / "runs" / name / "run.json").is_file() for name in runs)


@pytest.mark.parametrize(
    "command",
    [["run", "a goal", "--yes"], ["demo"], ["batch", "goals.jsonl"], ["bench"]],
)
def test_an_empty_out_is_refused_and_nothing_is_written_here(
    command: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--out "$DIR"`` with DIR unset: read as the current directory it would put a run's
    files where the command was typed."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "goals.jsonl").write_text('{"goal": "g"}\n')
    result = runner.invoke(app, [*command, "--out", " "])
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--out' / '-o': is empty: give a directory" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["goals.jsonl"]


@pytest.mark.parametrize(
    "earlier", ['{"goal": "my own goal", "scenario": null}', "not a record", '["a", "list"]']
)
def test_the_demo_does_not_replace_the_record_of_another_run(tmp_path: Path, earlier: str) -> None:
    (tmp_path / "run.json").write_text(earlier)
    result = runner.invoke(app, ["demo", "-o", str(tmp_path), "--sim-latency-scale", "0"])
    assert result.exit_code == 2, result.output
    assert "is not the record of a demo (or another data-migration run)" in result.output
    assert "give the demo another --out" in result.output
    assert (tmp_path / "run.json").read_text() == earlier
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]
