"""``--trace`` wiring: targets, the JSON-lines file, OTLP/HTTP to a loopback receiver, the
console and bad input."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from tracing_support import ScriptedRun, ran

import hierplan
from hierplan.errors import UserInputError
from hierplan.tracing.setup import TraceTarget, configure_tracing, parse_trace_target

HIERPLAN = [sys.executable, "-c", "from hierplan.cli import main; main()"]


class Receiver:
    """A loopback OTLP/HTTP receiver that keeps what it is sent, by URL path."""

    def __init__(self) -> None:
        self.bodies: dict[str, list[bytes]] = {}
        received = self.bodies

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                received.setdefault(self.path, []).append(self.rfile.read(length))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def spans(self) -> list[Any]:
        out = []
        for body in self.bodies.get("/v1/traces", []):
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            for resource in request.resource_spans:
                for scope in resource.scope_spans:
                    out.extend(scope.spans)
        return out

    def metric_names(self) -> set[str]:
        names: set[str] = set()
        for body in self.bodies.get("/v1/metrics", []):
            request = ExportMetricsServiceRequest()
            request.ParseFromString(body)
            for resource in request.resource_metrics:
                for scope in resource.scope_metrics:
                    names.update(m.name for m in scope.metrics)
        return names


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    found = Receiver()
    found.thread.start()
    yield found
    found.server.shutdown()
    found.server.server_close()


def test_trace_targets_parse_and_bad_ones_say_what_to_write() -> None:
    assert parse_trace_target("console") == TraceTarget("console")
    assert parse_trace_target("otlp") == TraceTarget("otlp")
    assert parse_trace_target(" OTLP=https://collector:4318 ") == TraceTarget(
        "otlp", "https://collector:4318"
    )
    assert parse_trace_target("jsonl=out/spans.jsonl") == TraceTarget("jsonl", "out/spans.jsonl")
    for bad, says in [
        ("zipkin", "unknown --trace target 'zipkin': use console, otlp"),
        ("jsonl", "names no file"),
        ("jsonl=", "names no file"),
        ("otlp=collector:4318", "must start with http:// or https://"),
        ("console=x", "unknown --trace target"),
    ]:
        with pytest.raises(UserInputError, match=says):
            parse_trace_target(bad)
    assert configure_tracing(None) is None and configure_tracing([]) is None


def test_a_trace_target_given_twice_is_refused_before_any_file_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for twice in (["jsonl=t.jsonl", f"jsonl={tmp_path}/t.jsonl"], ["console", "console"]):
        with pytest.raises(UserInputError, match=r"--trace \S+ is given twice: give each"):
            configure_tracing(twice)
    assert list(tmp_path.iterdir()) == []


def test_cli_rejects_a_bad_trace_target_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [*HIERPLAN, "demo", "--trace", "zipkin", "-o", str(tmp_path / "demo")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: unknown --trace target 'zipkin': use console, otlp, otlp=URL or jsonl=PATH"
    ]
    assert not (tmp_path / "demo").exists()


def test_jsonl_file_in_a_directory_that_cannot_be_made(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(UserInputError, match=f"{blocker} is a file, not a directory"):
        configure_tracing([f"jsonl={blocker}/spans.jsonl"])


def test_batch_settings_the_sdk_refuses_are_refused_before_a_file_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "-1")
    spans = tmp_path / "trace" / "spans.jsonl"
    with pytest.raises(UserInputError, match=r"max_queue_size must be a positive.*OTEL_BSP"):
        configure_tracing([f"jsonl={spans}"])
    assert not spans.exists()


def test_otlp_without_the_extra_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    with pytest.raises(UserInputError, match=r"pip install 'hierplan\[otlp\]'"):
        configure_tracing(["otlp"])


def test_demo_exports_over_otlp_and_to_a_jsonl_file(tmp_path: Path, receiver: Receiver) -> None:
    spans_file = tmp_path / "trace" / "spans.jsonl"
    done = subprocess.run(
        [
            *HIERPLAN,
            "demo",
            "--sim-latency-scale",
            "0",
            "-o",
            str(tmp_path / "demo"),
            "--trace",
            f"otlp={receiver.url}",
            "--trace",
            f"jsonl={spans_file}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    # 1 is a run that did not succeed (the simulator's noise); it is traced all the same
    assert done.returncode in (0, 1) and done.stderr == "", done.stderr
    record = json.loads((tmp_path / "demo" / "run.json").read_text())
    lines = [json.loads(line) for line in spans_file.read_text().splitlines()]
    fields = {
        "name",
        "trace_id",
        "span_id",
        "parent_span_id",
        "kind",
        "start_time",
        "end_time",
        "status",
        "attributes",
        "events",
        "resource",
        "links",
    }
    assert all(set(line) == fields for line in lines)
    ids = {line["span_id"] for line in lines}
    roots = [line for line in lines if line["parent_span_id"] is None]
    assert [r["name"] for r in roots] == ["invoke_workflow hierplan"]
    assert all(line["parent_span_id"] in ids for line in lines if line not in roots)
    assert len({line["trace_id"] for line in lines}) == 1
    assert roots[0]["resource"]["service.name"] == "hierplan"
    chats = [line for line in lines if line["name"].startswith("chat ")]
    assert len(chats) == record["totals"]["calls"]
    assert sum(c["attributes"]["gen_ai.usage.cost"] for c in chats) == pytest.approx(
        record["totals"]["cost_usd"], abs=1e-12
    )
    agents = [line for line in lines if line["name"].startswith("invoke_agent")]
    assert sorted(a["attributes"]["hierplan.node.path"] for a in agents) == sorted(
        ran(record["tree"])
    )
    # the same spans arrived over OTLP/HTTP, with the metrics
    received = receiver.spans()
    assert sorted(s.span_id.hex() for s in received) == sorted(ids)
    assert {
        "gen_ai.client.token.usage",
        "gen_ai.client.operation.duration",
        "hierplan.client.cost",
    } <= receiver.metric_names()


def test_otlp_honours_the_standard_variables(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "shop-migration")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test")
    setup = configure_tracing(["otlp"])
    assert setup is not None and setup.meter_provider is None
    with setup:
        hierplan.run_sync(instruments=setup.instruments, **ScriptedRun().run_options())
    assert "/v1/metrics" not in receiver.bodies
    (body,) = receiver.bodies["/v1/traces"]
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    resource = {a.key: a.value.string_value for a in request.resource_spans[0].resource.attributes}
    assert resource["service.name"] == "shop-migration"
    assert resource["deployment.environment"] == "test"
    assert len(receiver.spans()) == 26  # 1 workflow, 8 agents, 4 plans, 7 chats, 6 tools


@pytest.mark.parametrize(
    ("service_name", "attributes", "expected"),
    [
        (None, "service.name=shop,deployment.environment=test", "shop"),
        ("billing", "service.name=shop", "billing"),  # OTEL_SERVICE_NAME wins, as specified
        (None, "deployment.environment=test", "hierplan"),
        (None, None, "hierplan"),
    ],
)
def test_the_service_name_comes_from_the_standard_variables(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    service_name: str | None,
    attributes: str | None,
    expected: str,
) -> None:
    for name, value in (
        ("OTEL_SERVICE_NAME", service_name),
        ("OTEL_RESOURCE_ATTRIBUTES", attributes),
    ):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    setup = configure_tracing([f"jsonl={tmp_path / 'spans.jsonl'}"])
    assert setup is not None
    with setup:
        assert setup.tracer_provider.resource.attributes["service.name"] == expected


def test_console_target_writes_spans_and_metrics_to_its_stream() -> None:
    stream = io.StringIO()
    setup = configure_tracing(["console"], console_stream=stream)
    assert setup is not None
    with setup:
        hierplan.run_sync(instruments=setup.instruments, **ScriptedRun().run_options())
    text = stream.getvalue()
    assert text.count('"name": "invoke_agent executor"') == 5
    assert '"name": "gen_ai.client.token.usage"' in text
