"""Durable runs: a paused run's checkpoint (:mod:`~hierplan.durable.checkpoint`), what a
resumed run restores from it (:mod:`~hierplan.durable.restore`), and the lock that lets one
process at a time write a run directory (:mod:`~hierplan.durable.lock`)."""
