"""Plans as data: :class:`~hierplan.plans.plan.Plan` and its steps, their validation, plan
files, diffs between versions (:mod:`hierplan.plans.plan`), the findings of validation and how
they are capped (:mod:`hierplan.plans.problems`), the decisions a reviewer makes on a plan
(:mod:`hierplan.plans.decisions`), and the compact format a planner model writes a plan in
(:mod:`hierplan.plans.compact`)."""
