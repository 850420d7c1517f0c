"""Plans as data: :class:`~hierplan.plans.plan.Plan` and its steps, their validation, plan
files, diffs between versions (:mod:`hierplan.plans.plan`), the findings of validation and how
they are capped (:mod:`hierplan.plans.problems`), and the decisions a reviewer makes on a plan
(:mod:`hierplan.plans.decisions`)."""
