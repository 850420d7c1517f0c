"""The offline simulator: a seeded stand-in for an LLM (:mod:`~hierplan.simulator.model`) that
answers what a scenario's or benchmark suite's oracle (:mod:`~hierplan.simulator.oracle`) knows,
with noise and latency from a profile (:mod:`~hierplan.simulator.profiles`). It sits outside
the model layer, which knows nothing of plans or prices."""
