"""Traces of runs on the real provider adapters (over the local wire server), and no duplicate
``chat`` span from the Anthropic SDK's own instrumentation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from tracing_support import Telemetry, check_cost_invariants
from wire import MODELS, TEST_KEY, OracleBackend, Reply, ScriptBackend, WireServer, model_options

import hierplan
from hierplan import FunctionModel
from hierplan.models.counting import bound_input_tokens
from hierplan.models.tokens import anthropic_tool_prompt_tokens, estimate_request_tokens
from hierplan.scenarios import get_scenario
from hierplan.scenarios.base import ScenarioEnv

TESTS = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, ScenarioEnv]]:
    workdir = tmp_path_factory.mktemp("migration")
    yield workdir, get_scenario("data_migration").setup(workdir)


@pytest.mark.anyio
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_run_on_a_real_provider_is_traced(
    provider: str, scenario: tuple[Path, ScenarioEnv]
) -> None:
    workdir, env = scenario
    telemetry = Telemetry()
    with WireServer(OracleBackend(env.oracle)) as server:
        result = await hierplan.run(
            scenario="data_migration",
            model=hierplan.ModelSpec(name=MODELS[provider], **model_options(server, provider)),
            workdir=workdir,
            settings=hierplan.RunSettings(retry_backoff_s=0.01),
            instruments=[telemetry.tracing(capture_content=True)],
        )
        hits = server.count()
    spans = telemetry.finished()
    check_cost_invariants(result, spans)
    chats = [s for s in spans if s.name.startswith("chat ")]
    assert len(chats) == hits == result.totals()["calls"]
    name = MODELS[provider].partition(":")[2]
    for chat in chats:
        attributes = chat.attributes or {}
        assert chat.name == f"chat {name}" and chat.kind.name == "CLIENT"
        assert attributes["gen_ai.provider.name"] == provider
        assert attributes["gen_ai.request.model"] == name
        assert str(attributes["gen_ai.response.model"]).startswith(name)
        assert float(attributes["gen_ai.usage.cost"]) > 0  # type: ignore[arg-type]
    text = json.dumps([dict(s.attributes or {}) for s in spans], default=str)
    assert "hierplan.simulated" not in text  # real answers are not labelled simulated
    assert TEST_KEY not in text  # content is on, and still no key


@pytest.mark.anyio
@pytest.mark.parametrize("budget_tokens", [None, 100_000], ids=["unbudgeted", "budgeted"])
async def test_a_reply_without_usage_counts_anthropics_tool_use_prompt_in_span_and_record(
    budget_tokens: int | None,
) -> None:
    # The executor's call offers a tool, so Anthropic adds its tool-use system prompt: the worst
    # case of a reply without usage holds it in the chat span, the record and the budget alike.
    telemetry = Telemetry()
    seen: list[hierplan.ModelRequest] = []

    class Keep(hierplan.Instrument):
        """Keeps the requests the adapter is sent."""

        def wrap_model(self, model: hierplan.Model, node: hierplan.NodeView) -> hierplan.Model:
            async def send(request: hierplan.ModelRequest) -> hierplan.ModelResponse:
                seen.append(request)
                return await model.request(request)

            return FunctionModel(send, model.name, model.priced_as, report_usage=False)

    @hierplan.tool
    def wave(name: str) -> str:
        """Wave at someone."""
        return f"waved at {name}"

    script = [Reply(text="a. task: say hi"), Reply(text="hi")]
    with WireServer(ScriptBackend(script)) as server:
        server.faults.script([None, "no_usage"])
        result = await hierplan.run(
            "greet",
            model=hierplan.ModelSpec(
                name=MODELS["anthropic"], **model_options(server, "anthropic")
            ),
            strategy="dag",
            tools=[wave],
            instruments=[Keep(), telemetry.tracing()],
            budget={"tokens": budget_tokens},
        )
    assert result.status == "succeeded", result.error
    spans = telemetry.finished()
    check_cost_invariants(result, spans)
    (call,) = [c for n in result.nodes() for c in n.calls if c.phase == "execution"]
    assert call.flags == ["no_usage"]
    assert seen[1].tools  # the executor's request offers the tool
    # Under a budget the worst case is what it reserved: on Anthropic, by the bound (a token per
    # byte: no tokenizer of Anthropic's runs here); without one, the estimate.
    counted = bound_input_tokens if budget_tokens else estimate_request_tokens
    hidden = anthropic_tool_prompt_tokens(MODELS["anthropic"].partition(":")[2], forced=False)
    assert hidden > 0
    assert call.usage.input_tokens == counted(seen[1]) + hidden
    (chat,) = [s for s in spans if (s.attributes or {}).get("hierplan.phase") == "execution"]
    assert (chat.attributes or {})["gen_ai.usage.input_tokens"] == call.usage.input_tokens


ANTHROPIC_CHECK = textwrap.dedent(
    """
    import json, sys

    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from wire import MODELS, TEST_KEY, Reply, ScriptBackend, WireServer, model_options

    import hierplan

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)  # an application that registers a global provider

    tracing = hierplan.Tracing(provider_spans=sys.argv[1] == "keep")
    with WireServer(ScriptBackend([Reply(text="done")])) as server:
        result = hierplan.run_sync(
            "say done",
            strategy="react",
            model=hierplan.ModelSpec(
                name=MODELS["anthropic"], **model_options(server, "anthropic")
            ),
            instruments=[tracing],
        )
    assert result.status == "succeeded", result.error
    spans = exporter.get_finished_spans()
    ids = {s.context.span_id: s for s in spans}
    chats = [s for s in spans if s.kind.name == "CLIENT"]
    print(json.dumps({
        "chats": sorted(
            (s.instrumentation_scope.name, ids[s.parent.span_id].name if s.parent else None)
            for s in chats
        ),
        "key_seen": TEST_KEY in json.dumps([dict(s.attributes) for s in spans], default=str),
    }))
    """
)


@pytest.mark.parametrize(
    ("mode", "chats"),
    [
        ("default", [["hierplan", "invoke_agent executor"]]),
        # kept on request: the SDK's span duplicates hierplan's, below it (what the default avoids)
        (
            "keep",
            [
                ["com.anthropic.sdk.python", "chat claude-haiku-4-5"],
                ["hierplan", "invoke_agent executor"],
            ],
        ),
    ],
)
def test_no_duplicate_chat_span_from_the_anthropic_sdk(
    mode: str, chats: list[list[str]], tmp_path: Path
) -> None:
    script = tmp_path / "check.py"
    script.write_text(ANTHROPIC_CHECK)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    # The tests' helpers, before the hierplan under test (as the caller's PYTHONPATH gives it).
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, str(script), mode], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out == {"chats": chats, "key_seen": False}
