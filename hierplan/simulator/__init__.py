"""hierplan.simulator."""
