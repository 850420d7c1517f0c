"""Plans as data: :class:`~hierplan.plans.plan.Plan` and its steps, their validation, plan
files, diffs between versions (:mod:`hierplan.plans.plan`), and the decisions a reviewer makes
on a plan (:mod:`hierplan.plans.decisions`)."""
