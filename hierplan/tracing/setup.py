"""Exporter wiring for the CLI's ``--trace``: console, OTLP over HTTP, or a JSON-lines file.

``--trace`` takes one target per use and may be repeated:

- ``console``: finished spans (and, at exit, metrics) as JSON on stderr;
- ``otlp`` or ``otlp=URL``: spans and metrics over OTLP/HTTP (the ``otlp`` extra:
  ``pip install 'hierplan[otlp]'``). Without a URL the standard ``OTEL_EXPORTER_OTLP_*``
  variables decide where (default ``http://localhost:4318``); a URL is the collector's base
  address (``/v1/traces`` and ``/v1/metrics`` are added) or the full traces address. Headers,
  timeouts, compression and certificates always come from the standard variables, and
  ``OTEL_METRICS_EXPORTER=none`` turns the metrics export off (for backends that take traces only);
- ``jsonl=PATH``: one finished span per line in ``PATH`` (see :class:`JsonLinesSpanExporter`).

:func:`configure_tracing` builds SDK providers of its own and never registers them globally, so
it cannot interfere with an application's OpenTelemetry set-up. The service name is
``hierplan`` unless ``OTEL_SERVICE_NAME`` (or ``service.name`` in ``OTEL_RESOURCE_ATTRIBUTES``)
says otherwise; ``OTEL_RESOURCE_ATTRIBUTES`` is honoured.

>>> with configure_tracing(["jsonl=runs/spans.jsonl"]) as setup:  # doctest: +SKIP
...     hierplan.run_sync(scenario="data_migration", instruments=setup.instruments)
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import SERVICE_NAME, OTELResourceDetector, Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
    SpanExportResult,
)

from hierplan.core.instrument import Instrument
from hierplan.errors import UserInputError
from hierplan.files import make_directory
from hierplan.models.provider import one_line
from hierplan.tracing.otel import Tracing

TRACE_HELP = (
    "Export an OpenTelemetry trace: console, otlp[=URL] or jsonl=PATH (repeatable). "
    "OTLP needs the otlp extra; OTEL_EXPORTER_OTLP_* variables are honoured."
)
_TARGETS_HINT = "use console, otlp, otlp=URL or jsonl=PATH"
OTLP_INSTALL_HINT = "pip install 'hierplan[otlp]'"


@dataclass(slots=True, frozen=True)
class TraceTarget:
    """One parsed ``--trace`` value: ``kind`` is console, otlp or jsonl; ``value`` its URL/path."""

    kind: str
    value: str | None = None


def parse_trace_target(spec: str) -> TraceTarget:
    """Parse one ``--trace`` value; a bad one raises :class:`UserInputError` saying why.

    >>> parse_trace_target("otlp=http://127.0.0.1:4318")
    TraceTarget(kind='otlp', value='http://127.0.0.1:4318')
    """
    kind, sep, value = spec.strip().partition("=")
    kind = kind.strip().lower()
    value = value.strip()
    if kind == "console" and not sep:
        return TraceTarget("console")
    if kind == "otlp":
        if sep and not value.startswith(("http://", "https://")):
            raise UserInputError(
                f"--trace {spec!r}: the OTLP address must start with http:// or https://"
            )
        return TraceTarget("otlp", value or None)
    if kind == "jsonl":
        if not value:
            raise UserInputError(f"--trace {spec!r} names no file: write it as jsonl=PATH")
        return TraceTarget("jsonl", value)
    raise UserInputError(f"unknown --trace target {spec!r}: {_TARGETS_HINT}")


class JsonLinesSpanExporter(SpanExporter):
    """Writes one finished span per line as JSON.

    Each line has ``name``, ``trace_id`` and ``span_id`` (hex), ``parent_span_id`` (hex or
    null), ``kind``, ``start_time`` and ``end_time`` (nanoseconds since the epoch), ``status``
    (``code`` and ``description``), ``attributes``, ``events`` (``name``, ``time``,
    ``attributes``), ``resource`` and ``links`` (``trace_id``, ``span_id``, ``attributes``: a
    resumed run's workflow span links to the paused run's). Lines are written whole and flushed
    per batch.
    """

    def __init__(self, path: Path) -> None:
        make_directory(path.parent, f"the directory of --trace jsonl={path},")
        try:
            self._file: IO[str] | None = path.open("a", encoding="utf-8")
        except OSError as exc:
            raise UserInputError(
                f"--trace jsonl={path}: cannot open the file ({exc.strerror or exc})"
            ) from None
        self.path = path
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Append ``spans`` to the file."""
        lines = "".join(json.dumps(span_to_dict(s), default=str) + "\n" for s in spans)
        with self._lock:
            if self._file is None:
                return SpanExportResult.FAILURE
            self._file.write(lines)
            self._file.flush()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        """Close the file."""
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Everything is flushed on export already."""
        return True


def span_to_dict(span: ReadableSpan) -> dict[str, Any]:
    """A finished span as the JSON-ready dict that ``jsonl`` writes."""
    context = span.get_span_context()
    parent = span.parent
    return {
        "name": span.name,
        "trace_id": f"{context.trace_id:032x}" if context else None,
        "span_id": f"{context.span_id:016x}" if context else None,
        "parent_span_id": f"{parent.span_id:016x}" if parent else None,
        "kind": span.kind.name,
        "start_time": span.start_time,
        "end_time": span.end_time,
        "status": {
            "code": span.status.status_code.name,
            "description": span.status.description,
        },
        "attributes": _plain(span.attributes),
        "events": [
            {"name": e.name, "time": e.timestamp, "attributes": _plain(e.attributes)}
            for e in span.events
        ],
        "resource": _plain(span.resource.attributes),
        "links": [
            {
                "trace_id": f"{link.context.trace_id:032x}",
                "span_id": f"{link.context.span_id:016x}",
                "attributes": _plain(link.attributes),
            }
            for link in span.links
        ],
    }


def _plain(attributes: Any) -> dict[str, Any]:
    return {
        k: list(v) if isinstance(v, tuple | list) else v for k, v in dict(attributes or {}).items()
    }


@dataclass
class TraceSetup:
    """Providers built for the CLI, and the :class:`Tracing` instrument that uses them.

    Pass :attr:`instruments` to :func:`hierplan.run`; call :meth:`shutdown` (or use it as a
    context manager) after the run so that every span and metric is exported.
    """

    tracing: Tracing
    tracer_provider: TracerProvider
    meter_provider: MeterProvider | None = None
    targets: list[TraceTarget] = field(default_factory=list)

    @property
    def instruments(self) -> list[Instrument]:
        """The instruments to pass to :func:`hierplan.run`."""
        return [self.tracing]

    def shutdown(self) -> None:
        """Export what is left and close the exporters."""
        self.tracer_provider.shutdown()
        if self.meter_provider is not None:
            self.meter_provider.shutdown()

    def __enter__(self) -> TraceSetup:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.shutdown()


def _otlp_url(base: str, signal: str) -> str:
    base = base.rstrip("/")
    for known in ("/v1/traces", "/v1/metrics"):
        if base.endswith(known):
            base = base[: -len(known)]
    return f"{base}/v1/{signal}"


def _otlp_exporters(target: TraceTarget) -> tuple[SpanExporter, MetricExporter | None]:
    try:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        raise UserInputError(
            f"--trace otlp needs the OTLP exporter, which is not installed: {OTLP_INSTALL_HINT}"
        ) from None
    metrics_off = os.environ.get("OTEL_METRICS_EXPORTER", "").strip().lower() == "none"
    if target.value is None:
        spans = OTLPSpanExporter()
        return spans, None if metrics_off else OTLPMetricExporter()
    spans = OTLPSpanExporter(endpoint=_otlp_url(target.value, "traces"))
    if metrics_off:
        return spans, None
    return spans, OTLPMetricExporter(endpoint=_otlp_url(target.value, "metrics"))


def _resource() -> Resource:
    """The standard variables' resource, named ``hierplan`` unless they name the service: by
    ``OTEL_SERVICE_NAME`` or by ``service.name`` in ``OTEL_RESOURCE_ATTRIBUTES``."""
    named = OTELResourceDetector().detect().attributes.get(SERVICE_NAME)
    return Resource.create({} if named else {SERVICE_NAME: "hierplan"})


class _NoExport(SpanExporter):
    """Exports nothing: the exporter of the probe in :func:`_check_batch_settings`."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Drop ``spans``."""
        return SpanExportResult.SUCCESS


def _check_batch_settings() -> None:
    """Refuse ``OTEL_BSP_*`` settings the SDK's batch processor refuses (a queue of -1, say),
    before any exporter opens a file or a connection: the SDK raises a bare ValueError."""
    try:
        probe = BatchSpanProcessor(_NoExport())
    except ValueError as exc:
        raise UserInputError(
            f"OpenTelemetry's batch settings are invalid: {exc} Fix or unset the OTEL_BSP_* "
            "environment variables (OTEL_BSP_MAX_QUEUE_SIZE, OTEL_BSP_SCHEDULE_DELAY, "
            "OTEL_BSP_MAX_EXPORT_BATCH_SIZE)."
        ) from None
    probe.shutdown()  # type: ignore[no-untyped-call]  # the SDK leaves it unannotated


def _refuse_repeated(targets: Sequence[TraceTarget]) -> None:
    """Refuse a target given twice (the same file by any spelling of its path): each copy
    would get every span, and a trace file would hold each span twice."""
    seen: set[tuple[str, str | None]] = set()
    for target in targets:
        value = target.value
        if target.kind == "jsonl" and value:
            value = str(Path(value).expanduser().resolve())
        if (target.kind, value) in seen:
            shown = target.kind if target.value is None else f"{target.kind}={target.value}"
            raise UserInputError(f"--trace {shown} is given twice: give each target once")
        seen.add((target.kind, value))


def configure_tracing(
    specs: Sequence[str] | None,
    *,
    capture_content: bool | None = None,
    console_stream: IO[str] | None = None,
) -> TraceSetup | None:
    """Build providers and exporters for ``--trace`` values; ``None`` when there are none.

    Bad values raise :class:`UserInputError` before anything is opened or sent.
    """
    targets = [parse_trace_target(s) for s in specs or ()]
    if not targets:
        return None
    _refuse_repeated(targets)
    _check_batch_settings()
    resource = _resource()
    span_exporters: list[SpanExporter] = []
    metric_exporters: list[MetricExporter] = []
    stream = console_stream or sys.stderr
    for target in targets:
        if target.kind == "otlp":
            spans, metric = _otlp_exporters(target)
            span_exporters.append(spans)
            if metric is not None:
                metric_exporters.append(metric)
    for target in targets:  # files last, so that a bad OTLP set-up leaves no file behind
        if target.kind == "console":
            span_exporters.append(ConsoleSpanExporter(out=stream))
            metric_exporters.append(ConsoleMetricExporter(out=stream))
        elif target.kind == "jsonl":
            span_exporters.append(JsonLinesSpanExporter(Path(target.value or "")))
    tracer_provider = TracerProvider(resource=resource)
    for exporter in span_exporters:
        tracer_provider.add_span_processor(BatchSpanProcessor(exporter))
    meter_provider = None
    if metric_exporters:
        readers: list[MetricReader] = [PeriodicExportingMetricReader(e) for e in metric_exporters]
        meter_provider = MeterProvider(resource=resource, metric_readers=readers)
    tracing = Tracing(
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
        capture_content=capture_content,
    )
    return TraceSetup(tracing, tracer_provider, meter_provider, targets)


class _OneLineExportWarning(logging.Handler):
    """Says once, in one line, that the trace could not be exported; drops the rest."""

    def __init__(self, stream: IO[str]) -> None:
        super().__init__(logging.WARNING)
        self.stream = stream
        self.said = False

    def emit(self, record: logging.LogRecord) -> None:
        """Write the first problem's first line; later ones repeat it for other batches."""
        if self.said:
            return
        self.said = True
        try:
            problem = one_line(record.getMessage())
        except Exception:  # a record whose arguments do not format: say what is known
            problem = one_line(str(record.msg))
        self.stream.write(
            f"warning: the trace could not be exported (is the collector running and its "
            f"address right?); the run goes on without it: {problem}\n"
        )
        self.stream.flush()


@contextmanager
def export_problems_in_one_line(stream: IO[str] | None = None) -> Iterator[None]:
    """While inside, OpenTelemetry exporters' warnings and errors (an OTLP collector that
    cannot be reached retries and logs every attempt) become one warning line on ``stream``
    (stderr by default). For command-line programs: it changes the ``opentelemetry.exporter``
    logger until the block ends."""
    logger = logging.getLogger("opentelemetry.exporter")
    handler = _OneLineExportWarning(stream or sys.stderr)
    propagate = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate
