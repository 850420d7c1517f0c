"""Renderings of a run record: the terminal tree (:mod:`hierplan.view.tree`), the
self-contained HTML report (:mod:`hierplan.view.html`) and the live console of a run
(:mod:`hierplan.view.console`)."""

from hierplan.view.html import render_html, write_html

__all__ = ["render_html", "write_html"]
