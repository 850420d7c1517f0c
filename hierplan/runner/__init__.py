"""Running: a :class:`~hierplan.runner.spec.RunSpec` made into a run (:mod:`~hierplan.runner.run`),
watched through a handle (:mod:`~hierplan.runner.handle`), resumed from a checkpoint
(:mod:`~hierplan.runner.resume`); the models a run resolves, its set-up and its node tree's
execution."""
