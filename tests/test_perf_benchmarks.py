"""Smoke tests of the performance benchmarks (benchmarks/*.py) at a small N.

They check the output's structure and that every leaf really completed, never a timing: the
benchmarks themselves are run by ``make bench``.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load(name: str) -> ModuleType:
    """Import ``benchmarks/<name>.py`` (registered, so that type hints of its classes resolve)."""
    spec = importlib.util.spec_from_file_location(
        f"bench_{name}", ROOT / "benchmarks" / f"{name}.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def overhead() -> ModuleType:
    return _load("overhead")


def _rows(data: dict[str, Any], impl: str) -> list[dict[str, Any]]:
    return [r for r in data["rows"] if r["impl"] == impl]


def test_the_hierplan_tree_keeps_every_plan_within_the_default_limit(overhead: Any) -> None:
    for leaves in (1, 20, 50, 51, 1000, 5000, 100_000):
        shape = overhead.tree_shape(leaves)
        assert sum(sum(m) for m in shape) == leaves
        assert len(shape) <= 50 and all(len(m) <= 50 and max(m) <= 50 for m in shape)
    with pytest.raises(ValueError, match="at most 125000 leaves"):
        overhead.tree_shape(125_001)


def test_tool_only_leaves_call_their_tool_and_no_model(overhead: Any) -> None:
    result = anyio.run(partial(overhead.hierplan_result, 60, 0.0, direct=True))
    leaves = [n for n in result.tree.walk() if n.kind == "executor"]
    assert len(leaves) == overhead.count_leaves(result.tree) == 60
    for leaf in leaves:
        assert leaf.calls == [] and leaf.budget is None  # no model call, no account of its own
        assert [t.tool for t in leaf.tool_calls] == [overhead.WAIT_TOOL]
    # Each leaf's arguments are its own (its number in the run), as a real plan's are.
    arguments = sorted(json.loads(leaf.tool_calls[0].arguments)["n"] for leaf in leaves)
    assert arguments == list(range(60))
    assert anyio.run(overhead.run_hierplan_direct, 3) == 3


def test_overhead_runs_every_leaf_of_each_implementation(
    overhead: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = overhead.main(
        ["--leaves", "10,30", "--repeats", "1", "--in-process", "--out", str(tmp_path)]
    )
    assert (tmp_path / "overhead.json").exists()
    assert {"cpus", "python", "platform", "packages"} <= set(data["machine"])
    for impl in ("hierplan", "anyio"):
        rows = _rows(data, impl)
        assert [r["leaves"] for r in rows] == [10, 30]
        for row in rows:
            assert row["available"] and row["leaves_completed"] == row["leaves"]
            assert row["wall_s"] >= overhead.LEAF_S  # every leaf waited its 10 ms
            assert row["peak_rss_mb"] > 0
    langgraph = _rows(data, "langgraph")
    if overhead.langgraph_available():
        assert all(r["leaves_completed"] == r["leaves"] for r in langgraph)
        assert all(r["langgraph_vs_hierplan"] > 0 for r in data["ratios"])
    else:
        assert [r["available"] for r in langgraph] == [False, False]
    assert [r["leaves"] for r in data["ratios"]] == [10, 30]
    assert all(r["hierplan_vs_anyio"] > 0 for r in data["ratios"])
    assert "hierplan/anyio" in capsys.readouterr().out


def test_overhead_reports_langgraph_unavailable_instead_of_failing(
    overhead: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(overhead, "langgraph_available", lambda: False)
    data = overhead.main(["--leaves", "20", "--repeats", "1", "--in-process", "--no-out"])
    assert _rows(data, "langgraph") == [{"impl": "langgraph", "leaves": 20, "available": False}]
    assert data["ratios"][0]["langgraph_vs_hierplan"] is None
    assert _rows(data, "hierplan")[0]["leaves_completed"] == 20
    assert "n/a" in capsys.readouterr().out


def test_a_fresh_worker_process_measures_its_own_peak_memory(overhead: Any) -> None:
    row = overhead.sample("hierplan", 20, isolate=True)
    assert row["leaves_completed"] == 20
    assert row["peak_rss_mb"] >= row["rss_before_mb"] > 0


def test_makespan_is_never_below_the_critical_path_bound(tmp_path: Path) -> None:
    data = _load("makespan").main(
        ["--widths", "3", "--depths", "2", "--repeats", "1", "--out", str(tmp_path)]
    )
    (row,) = data["rows"]
    assert row["steps"] == row["steps_completed"] == 6
    for runner in ("hierplan", "anyio"):
        assert row[runner]["ratio"] >= 1.0  # no scheduler beats the bound
    assert data["worst_hierplan_ratio"] == row["hierplan"]["ratio"]


def test_the_critical_path_bound_is_the_longest_chain() -> None:
    makespan = _load("makespan")
    dag = makespan.Dag(2, 2, (0.01, 0.05, 0.03, 0.02), ((), (), (0, 1), (0,)))
    assert dag.bound == pytest.approx(0.08)  # 0.05 then 0.03


def test_scale_compares_the_large_run_with_the_small_one(tmp_path: Path) -> None:
    data = _load("scale").main(
        ["--small", "10", "--large", "60", "--repeats", "1", "--in-process", "--out", str(tmp_path)]
    )
    assert {(r["impl"], r["leaves"]) for r in data["rows"]} == {
        ("hierplan", 10),
        ("anyio", 10),
        ("hierplan", 60),
        ("anyio", 60),
    }
    assert all(r["leaves_completed"] == r["leaves"] for r in data["rows"])
    assert data["per_leaf_growth"]["hierplan"] != 0
    assert data["hierplan_large_peak_rss_mb"] > 0


def test_tracing_measures_every_configuration(tmp_path: Path) -> None:
    data = _load("tracing").main(["--leaves", "10", "--repeats", "1", "--out", str(tmp_path)])
    assert {"off", "api", "sdk-traces", "sdk", "sdk-replay", "sdk-floor"} <= set(data)
    assert data["off"]["ratio"] == 1.0
    assert data["sdk-floor"]["overhead_us_per_leaf"] > 0
    assert data["hierplan_us_per_leaf"]["cpu"] == pytest.approx(
        data["sdk"]["cpu_overhead_us_per_leaf"] - data["sdk-floor"]["cpu_overhead_us_per_leaf"]
    )
    assert (tmp_path / "tracing.json").exists()


def test_the_report_writes_tables_between_the_markers_and_keeps_the_prose(
    tmp_path: Path, overhead: Any
) -> None:
    results = tmp_path / "results"
    overhead.main(["--leaves", "20", "--repeats", "1", "--in-process", "--out", str(results)])
    readme = tmp_path / "README.md"
    readme.write_text("# Prose\n\n<!-- results:start -->\nold\n<!-- results:end -->\n\nAfter.\n")
    report = _load("report")
    report.main(
        ["--results", str(results), "--before", str(tmp_path / "none"), "--readme", str(readme)]
    )
    text = readme.read_text()
    assert text.startswith("# Prose\n") and text.endswith("After.\n") and "old" not in text
    assert "### overhead" in text and "| 20 | hierplan | — |" in text
    assert text.count("before: not run") == 6  # no baseline in this folder
    assert text.count("now: not run") == 5  # only overhead was run
    readme.write_text("no markers")
    with pytest.raises(SystemExit, match="markers"):
        report.main(["--results", str(results), "--readme", str(readme)])


def test_the_events_benchmark_reads_every_event_of_its_runs() -> None:
    import anyio

    events = _load("events")
    figures = anyio.run(events.main, 20, 1)
    # three per leaf; the run's start and end, and the root's start, plan call, proposal,
    # decision and end
    assert figures["events"] == 3 * 20 + 7
    assert figures["live_lag_events"] == 0
    assert set(figures["median_s"]) == {"bare", "consumer", "consumer_json"}
    assert figures["read_per_s"] > 0 and figures["bytes_per_event"] > 0


def test_the_memory_benchmark_counts_a_leaf_in_flight_and_after_the_run(tmp_path: Path) -> None:
    memory = _load("memory")
    args = ["--leaves", "200", "--top", "3", "--queued", "400", "--out", str(tmp_path)]
    figures = memory.main(args)
    # a leaf in flight holds more than a bare task, and keeps less after the run than in flight
    assert figures["in_flight_bytes"] > figures["anyio_in_flight_bytes"] > 0
    assert 0 < figures["after_bytes"] < figures["in_flight_bytes"]
    names = [name for name, _ in figures["chain"]]
    assert "run_task_node" in names and "LLMExecutor.execute" in names
    assert figures["types"]["hierplan.records.NodeRecord"][0] >= 1.0
    # a leaf is at least a task and its coroutine, more than a bare task's objects
    assert figures["objects"] > figures["anyio_objects"] >= 2
    # a step waiting in the plan's queue holds its plan entry, not a task (about 4 KB)
    assert 0 < figures["queued_peak_bytes"] < figures["anyio_in_flight_bytes"]
    # the figures per leaf go to memory.json, which the report's memory table reads
    written = json.loads((tmp_path / "memory.json").read_text())
    assert written["leaves"] == 200 and written["objects"] == figures["objects"]
    assert written["objects_over_anyio"] == figures["objects"] / figures["anyio_objects"]
    report = _load("report")
    table = report.memory(None, written)
    assert (
        f"| GC-tracked objects alive per leaf in flight, hierplan | — | {figures['objects']:,.1f} |"
        in table
    )


def test_the_report_shows_the_tool_only_leaf_beside_the_model_leaf() -> None:
    report = _load("report")
    now = {
        "leaves": 1000,
        "rows": [
            {"impl": "hierplan", "leaves": 1000, "per_leaf": 700_000.0},
            {"impl": "hierplan-direct", "leaves": 1000, "per_leaf": 350_000.0},
        ],
        "ratios": {"hierplan_direct_over_hierplan": 0.5},
    }
    table = report.instructions(None, now)
    assert "| hierplan, tool-only leaf | — | 350,000 |" in table
    assert "| tool-only leaf / model leaf | — | 0.50 |" in table


def test_the_collector_statistics_time_each_sides_own_passes() -> None:
    profile_leaves = _load("profile_leaves")
    collect = gc.collect
    data = profile_leaves.main(["--n", "50", "--gc-stats"])
    assert gc.collect is collect  # the side's own gc.collect() was skipped only during the run
    rows = data["gc_rows"]
    assert [(r["n"], r["side"]) for r in rows] == [(50, "hierplan"), (50, "bare")]
    for row in rows:
        assert 0 <= row["gc_us"] <= row["cpu_us"]
        assert row["gc_us"] == pytest.approx(sum(row["gen_us"]))
        assert row["full_passes"] == row["passes"][2]
    # A run allocates thousands of objects: the youngest generation is collected during it.
    assert rows[0]["passes"][0] > 0


def _valgrind_or_skip() -> None:
    # Under CI valgrind is installed (.ci/run): a missing one fails the test there.
    if shutil.which("valgrind") is None and not os.environ.get("CI"):
        pytest.skip("valgrind is not installed (apt-get install valgrind)")


def test_instruction_counts_cover_the_measured_run_of_each_implementation() -> None:
    _valgrind_or_skip()
    instructions = _load("instructions")
    small = instructions.main(
        [
            *("--leaves", "10", "--impls", "hierplan,hierplan-direct,anyio", "--tools", "2"),
            *("--step-timeout", "none", "--no-out"),
        ]
    )
    rows = {r["impl"]: r for r in small["rows"]}
    assert set(rows) == {"hierplan", "hierplan-direct", "anyio"}
    assert (rows["hierplan"]["tools"], rows["anyio"]["tools"]) == (2, 0)
    assert small["step_timeout_s"] is None and rows["hierplan-direct"]["step_timeout_s"] is None
    assert all(r["leaves_completed"] == 10 and r["instructions"] > 0 for r in rows.values())
    assert small["ratios"]["hierplan_over_anyio"] == pytest.approx(
        rows["hierplan"]["per_leaf"] / rows["anyio"]["per_leaf"]
    )
    assert small["ratios"]["hierplan_direct_over_hierplan"] == pytest.approx(
        rows["hierplan-direct"]["per_leaf"] / rows["hierplan"]["per_leaf"]
    )
    assert small["ratios"]["langgraph_over_hierplan"] is None
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    assert small["hierplan_measured"]["commit"] == (head.stdout.strip() or None)
    # Imports and the warm-up are outside the count: importing hierplan alone executes over
    # 2,000 million instructions, ten sleeping tasks a few million.
    assert rows["anyio"]["instructions"] < 200_000_000


def test_instruction_dumps_are_read_in_the_order_callgrind_numbers_them(tmp_path: Path) -> None:
    instructions = _load("instructions")
    for number, total in ((1, 500), (2, 70), (10, 9)):
        (tmp_path / f"cg.out.{number}").write_text(
            f"events: Ir\nsummary: {total}\ntotals: {total}\n"
        )
    (tmp_path / "cg.out").write_text("totals: 1\n")  # the dump at exit: not a marker's
    assert instructions._dumped_totals(tmp_path) == [500, 70, 9]


@pytest.mark.parametrize("direct", [False, True])
def test_the_hierplan_runs_take_the_step_deadline_they_are_given(
    overhead: Any, direct: bool
) -> None:
    for given, kept in ((None, None), (2.5, 2.5), (overhead.STEP_TIMEOUT_S, 300.0)):
        result = anyio.run(
            partial(overhead.hierplan_result, 3, 0.0, direct=direct, step_timeout_s=given)
        )
        assert result.status == "succeeded" and result.settings["step_timeout_s"] == kept


def test_instructions_reads_a_step_deadline_or_none() -> None:
    parse = _load("instructions")._parse
    assert parse([]).step_timeout == 300.0  # RunSettings' own default
    assert parse(["--step-timeout", "none"]).step_timeout is None
    assert parse(["--step-timeout", "2.5"]).step_timeout == 2.5
    for wrong in ("0", "-1", "inf", "nan", "soon"):
        with pytest.raises(SystemExit) as refused:
            parse(["--step-timeout", wrong])
        assert refused.value.code == 2


def test_instructions_refuses_a_tree_without_hierplan(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as refused:
        _load("instructions").main(["--tree", str(tmp_path), "--no-out"])
    assert refused.value.code == 2


def test_the_console_benchmark_runs_each_listener_over_every_leaf() -> None:
    console = _load("console")
    data = console.main(["--leaves", "30", "--repeats", "1", "--no-out"])
    assert set(data["cpu_us_per_leaf"]) == {"none", "every-event", "console"}
    assert all(len(v) == 1 and v[0] > 0 for v in data["samples_us_per_leaf"].values())
    assert data["added_us_per_leaf"]["none"] == 0 and data["ratio"]["none"] == 1
    for name in ("every-event", "console"):
        expected = data["cpu_us_per_leaf"][name] / data["cpu_us_per_leaf"]["none"]
        assert data["ratio"][name] == expected


def test_the_record_benchmark_times_each_way_of_writing_the_record() -> None:
    record = _load("record")
    data = record.main(["--leaves", "30", "--repeats", "1", "--no-out"])
    assert set(data["us_per_leaf"]) == {"to_dict", "to_json", "json.dumps", "write", "print"}
    assert data["run_us_per_leaf"] > 0 and data["bytes_per_leaf"] > 0
    assert all(len(v) == 1 for v in data["samples_s"].values())


def test_the_faults_benchmark_follows_every_run_it_starts() -> None:
    import anyio

    faults = _load("faults")
    rows = anyio.run(faults.fault_runs, 2, 0.3, 2, 100, 3)
    assert [(r["provider"], r["seed"]) for r in rows] == [("openai", 100), ("anthropic", 101)]
    for row in rows:
        # Every faulted attempt is one the record holds as failed (a loaded machine may time
        # out one more), and a run that did not complete says why.
        assert row["failed_attempts"] >= row["faults_injected"] > 0
        assert row["completed"] or row["error"]


def test_the_startup_benchmark_times_each_command_against_the_bare_interpreter() -> None:
    startup = _load("startup")
    data = startup.main(["--repeats", "2", "--no-out"])
    assert set(data["median_ms"]) == {"python -c pass", "import hierplan", "hierplan --help"}
    assert all(len(v) == 2 and min(v) > 0 for v in data["samples_s"].values())
    base = data["median_ms"]["python -c pass"]
    for name, ratio in data["ratio"].items():
        assert ratio == data["median_ms"][name] / base
