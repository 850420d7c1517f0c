"""hierplan.durable."""
