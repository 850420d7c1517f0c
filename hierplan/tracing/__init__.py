"""Tracing and reports: OpenTelemetry spans and metrics (:class:`Tracing`, API only), the CLI's
exporter wiring (:mod:`hierplan.tracing.setup`, which needs the SDK), and the terminal and HTML
renderings of a run."""

from hierplan.tracing.html import render_html, write_html
from hierplan.tracing.otel import Tracing

__all__ = ["Tracing", "render_html", "write_html"]
