"""hierplan.plans."""
