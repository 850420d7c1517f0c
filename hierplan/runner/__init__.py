"""hierplan.runner."""
