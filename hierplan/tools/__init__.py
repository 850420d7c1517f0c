"""hierplan.tools."""
