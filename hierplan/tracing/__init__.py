"""Tracing: OpenTelemetry spans and metrics of a run (:class:`Tracing`, API only) and the CLI's
exporter wiring (:mod:`hierplan.tracing.setup`, which needs the SDK). Tracing reads the run
through the core's views and events only."""

from hierplan.tracing.otel import Tracing

__all__ = ["Tracing"]
