"""hierplan.view."""
