"""Choosing and configuring real models: keys, options, environment, CLI flags, doc examples.

The examples of the "Real models" page (docs/models.md) run here as written, against the local
wire server: the test only supplies the keys and base URLs a user would have in the environment.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from liveservice import free_port
from typer.testing import CliRunner
from wire import MODELS, PROVIDERS, TEST_KEY, OracleBackend, Reply, ScriptBackend, WireServer

import hierplan
from hierplan.cli import app
from hierplan.errors import ModelError, ModelNotAvailableError
from hierplan.models.base import Message, ModelRequest
from hierplan.runner.models import resolve_model
from hierplan.scenarios import get_scenario
from hierplan.scenarios.base import ScenarioEnv

MODELS_PAGE = Path(__file__).resolve().parent.parent / "docs" / "models.md"
VARIABLES = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}
GOAL = "Greet the user"
PLAN = {"goal": GOAL, "steps": [{"id": "g", "title": "Greet", "instruction": "Say hello"}]}
runner = CliRunner()


@pytest.fixture(scope="module")
def migration(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScenarioEnv]:
    yield get_scenario("data_migration").setup(tmp_path_factory.mktemp("oracle"))


def with_source(migration: ScenarioEnv, directory: Path) -> Path:
    """``directory`` holding a copy of the built source database, so runs skip building it."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(migration.info["source"], directory / "source.db")
    return directory


@pytest.mark.anyio
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_missing_key_fails_before_any_work_naming_the_variable(
    provider: str, tmp_path: Path
) -> None:
    workdir = tmp_path / "never"
    with pytest.raises(ModelNotAvailableError, match=f"set {VARIABLES[provider]}"):
        await hierplan.run(scenario="data_migration", model=MODELS[provider], workdir=workdir)
    assert not workdir.exists()  # the scenario was not set up


@pytest.mark.parametrize("provider", PROVIDERS)
def test_the_cli_reports_a_missing_key_on_one_line(provider: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = runner.invoke(
        app,
        ["run", "--scenario", "data_migration", "--model", MODELS[provider], "-y", "-o", str(out)],
    )
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and VARIABLES[provider] in lines[0]
    assert not out.exists()


@pytest.mark.anyio
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_keys_and_base_urls_come_from_the_standard_environment_variables(
    provider: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with WireServer(ScriptBackend([Reply(output=PLAN), Reply(text="hello")])) as server:
        monkeypatch.setenv(VARIABLES[provider], TEST_KEY)
        monkeypatch.setenv(f"{provider.upper()}_BASE_URL", server.base_url(provider))
        result = await hierplan.run(GOAL, model=MODELS[provider])
    assert result.status == "succeeded" and result.answer == "hello"


def test_model_options_are_checked() -> None:
    with pytest.raises(ModelNotAvailableError, match=r"unknown model option\(s\) base_ur;"):
        resolve_model("openai:gpt-5-mini", api_key="k", base_ur="http://x")
    with pytest.raises(ModelNotAvailableError, match="timeout_s must be more than 0 s"):
        resolve_model("anthropic:claude-haiku-4-5", api_key="k", timeout_s=0)
    with pytest.raises(ModelNotAvailableError, match="timeout_s must be a number"):
        resolve_model("openai:gpt-5-mini", api_key="k", timeout_s="soon")
    with pytest.raises(ModelNotAvailableError, match="set OPENAI_API_KEY"):
        resolve_model("openai:gpt-5-mini", api_key="  ")
    with pytest.raises(
        ModelNotAvailableError,
        match="max_tokens_field must be 'max_completion_tokens' or 'max_tokens', not 'max_token'",
    ):
        resolve_model("openai:gpt-5-mini", api_key="k", max_tokens_field="max_token")
    local = resolve_model("openai:llama3", api_key="k", priced_as="openai:gpt-5-nano")
    assert (local.name, local.priced_as, local.simulated) == (
        "openai:llama3",
        "openai:gpt-5-nano",
        False,
    )


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_missing_sdk_gives_a_clear_message(
    provider: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, provider, None)  # as if the package were not installed
    monkeypatch.delitem(sys.modules, f"hierplan.models.{provider}", raising=False)
    with pytest.raises(ModelNotAvailableError, match=f"needs the '{provider}' package"):
        resolve_model(MODELS[provider], api_key="k")


def test_base_url_and_timeout_are_refused_for_the_simulator() -> None:
    result = runner.invoke(
        app, ["run", "--scenario", "data_migration", "--base-url", "http://x", "--yes"]
    )
    assert result.exit_code == 2
    assert "--base-url and --timeout apply to real models" in result.output


@pytest.mark.parametrize("model", ["simple:gpt-5", "simulator"])
def test_a_model_that_only_starts_like_sim_is_an_unknown_model_not_the_simulator(
    model: str, tmp_path: Path
) -> None:
    """The simulator is ``sim`` or ``sim:<priced-as>``; a look-alike gets the unknown-model
    message (it was told that --base-url does not apply to the simulator)."""
    result = runner.invoke(
        app,
        [
            *("run", "a goal", "--model", model, "--base-url", "http://127.0.0.1:9"),
            *("--yes", "--out", str(tmp_path / "run")),
        ],
    )
    assert result.exit_code == 2, result.output
    assert f"unknown model {model!r}" in result.output
    assert "apply to real models" not in result.output


def test_the_cli_runs_over_the_wire_with_its_options(
    migration: ScenarioEnv, tmp_path: Path
) -> None:
    out = with_source(migration, tmp_path / "run")
    with WireServer(OracleBackend(migration.oracle)) as server:
        server.faults.script(["server_error", "server_error"])
        result = runner.invoke(
            app,
            [
                "run",
                "--scenario",
                "data_migration",
                "--model",
                "openai:gpt-5-mini",
                "--base-url",
                server.openai_base_url,
                "--timeout",
                "5",
                "--model-retries",
                "2",
                "--yes",
                "--out",
                str(out),
            ],
            env={"OPENAI_API_KEY": TEST_KEY},
        )
    assert result.exit_code == 0, result.output
    assert "SIMULATED" not in result.output
    record = json.loads((out / "run.json").read_text())
    assert record["status"] == "succeeded" and record["simulated"] is False
    assert record["settings"]["model_retries"] == 2
    assert record["verification"]["ok"] is True


def readme_section() -> str:
    """The "Real models" page of the documentation (docs/models.md)."""
    return MODELS_PAGE.read_text()


def readme_commands() -> list[list[str]]:
    blocks = re.findall(r"```sh\n(.*?)```", readme_section(), re.S)
    return [
        shlex.split(line, comments=True)
        for block in blocks
        for line in block.splitlines()
        if line.startswith("hierplan run")
    ]


def test_the_readme_shows_real_model_commands() -> None:
    commands = readme_commands()
    assert len(commands) == 4
    assert any("--base-url" in c for c in commands)
    assert {c[c.index("--model") + 1].split(":")[0] for c in commands} == set(PROVIDERS)


@pytest.mark.parametrize("index", range(len(readme_commands())))
def test_the_readme_commands_run(index: int, migration: ScenarioEnv, tmp_path: Path) -> None:
    args = readme_commands()[index][1:]
    out = with_source(migration, tmp_path / "run")
    with WireServer(OracleBackend(migration.oracle)) as server:
        if "--base-url" in args:  # the local server's address, here the wire server's
            args[args.index("--base-url") + 1] = server.openai_base_url
        env = {
            "OPENAI_API_KEY": TEST_KEY,
            "ANTHROPIC_API_KEY": TEST_KEY,
            "OPENAI_BASE_URL": server.openai_base_url,
            "ANTHROPIC_BASE_URL": server.anthropic_base_url,
        }
        result = runner.invoke(app, [*args, "--out", str(out)], env=env)
        assert server.count() > 0
    assert result.exit_code == 0, result.output
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["status"] == "succeeded" and not record["simulated"]


def test_the_readme_library_example_runs(
    migration: ScenarioEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocks = re.findall(r"```py\n(.*?)```", readme_section(), re.S)
    assert len(blocks) == 1
    monkeypatch.chdir(tmp_path)
    with_source(migration, tmp_path / "runs" / "scenarios" / "data_migration")
    with WireServer(OracleBackend(migration.oracle)) as server:
        monkeypatch.setenv("OPENAI_API_KEY", TEST_KEY)
        monkeypatch.setenv("OPENAI_BASE_URL", server.openai_base_url)
        scope: dict[str, Any] = {"__name__": "readme"}
        exec(compile(blocks[0], "docs/models.md", "exec"), scope)
        assert server.count() > 0
    assert scope["result"].status == "succeeded"


@pytest.mark.anyio
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_without_a_base_url_no_request_leaves_the_machine(provider: str) -> None:
    # The adapters' default is the provider's API; the test guard refuses it, as for any test.
    model = resolve_model(MODELS[provider], api_key="k", timeout_s=5)
    with pytest.raises(ModelError, match="connection failed"):
        await model.request(ModelRequest((Message("user", "hi"),)))
    await model.aclose()  # type: ignore[attr-defined]


BASE_URL_VARIABLES = {"openai": "OPENAI_BASE_URL", "anthropic": "ANTHROPIC_BASE_URL"}


def _closed_port_url(provider: str) -> str:
    """A base URL on loopback where nothing listens: connecting is refused at once."""
    port = free_port()  # bound, then released: free, and nothing listens on it
    return f"http://127.0.0.1:{port}" + ("/v1" if provider == "openai" else "")


@pytest.mark.anyio
@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("given_by", ["option", "environment"])
async def test_a_connection_that_cannot_be_made_names_the_url_and_what_to_check(
    provider: str, given_by: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = _closed_port_url(provider)
    options: dict[str, Any] = {"api_key": "k", "timeout_s": 5}
    if given_by == "option":
        options["base_url"] = url
    else:
        monkeypatch.setenv(BASE_URL_VARIABLES[provider], url)
    model = resolve_model(MODELS[provider], **options)
    try:
        with pytest.raises(ModelError) as caught:
            await model.request(ModelRequest((Message("user", "hi"),)))
    finally:
        await model.aclose()  # type: ignore[attr-defined]
    message = str(caught.value)
    assert f"{MODELS[provider]}: connection failed to {url}" in message
    assert f"check --base-url (or {BASE_URL_VARIABLES[provider]})" in message
    assert "the network reaches it" in message and VARIABLES[provider] in message
    assert caught.value.retryable


def test_the_cli_names_the_url_it_could_not_connect_to(tmp_path: Path) -> None:
    url = _closed_port_url("openai")
    result = runner.invoke(
        app,
        [
            *("run", GOAL, "--model", MODELS["openai"], "--base-url", url),
            *("--model-retries", "0", "-y", "-o", str(tmp_path / "run")),
        ],
        env={"OPENAI_API_KEY": TEST_KEY, "COLUMNS": "200"},
    )
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    flat = " ".join(result.output.split())
    assert f"connection failed to {url}" in flat and "check --base-url" in flat


def test_the_cli_stops_on_a_refused_key_with_the_providers_message(tmp_path: Path) -> None:
    with WireServer(ScriptBackend([])) as server:
        result = runner.invoke(
            app,
            [
                *("run", GOAL, "--model", MODELS["openai"]),
                *("--base-url", server.openai_base_url, "-y", "-o", str(tmp_path / "run")),
            ],
            env={"OPENAI_API_KEY": "sk-wrong"},
        )
        assert server.count() == 1
    assert result.exit_code == 2
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("error: openai:gpt-5-mini: HTTP 401: invalid_api_key:")
    assert hierplan.ModelAuthError.__name__ in hierplan.__all__


def test_a_proxys_html_refusal_of_the_key_is_still_a_one_line_error(tmp_path: Path) -> None:
    # A proxy in front of the API answers 401 with its own HTML page, many lines long.
    with WireServer(ScriptBackend([])) as server:
        server.faults.script(["html_error"])
        result = runner.invoke(
            app,
            [
                *("run", GOAL, "--model", MODELS["anthropic"]),
                *("--base-url", server.anthropic_base_url, "-y", "-o", str(tmp_path / "run")),
            ],
            env={"ANTHROPIC_API_KEY": TEST_KEY},
        )
    assert result.exit_code == 2
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("error: anthropic:claude-haiku-4-5: HTTP 401: <html><head><title>401")
    assert "</body>" in last or last.endswith("…")  # the page, on this one line
    assert "</html>" not in result.output  # cut, not printed whole
