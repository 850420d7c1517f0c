"""The seam between the orchestration and what wraps it: the instrument protocol
(:mod:`~hierplan.core.instrument`), read-only views of a run and a node and the environment of a
step (:mod:`~hierplan.core.views`), the events (:mod:`~hierplan.core.events`), one model call
as counted (:mod:`~hierplan.core.calls`), a step's result and the run settings."""
