"""hierplan.core."""
