"""Tracing and reports: OpenTelemetry spans and metrics (:class:`Tracing`, API only), the CLI's
exporter wiring (:mod:`hierplan.tracing.setup`, which needs the SDK), and the terminal and HTML
renderings of a run."""

from hierplan.tracing.otel import Tracing
from hierplan.view.html import render_html, write_html

__all__ = ["Tracing", "render_html", "write_html"]
