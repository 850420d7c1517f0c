"""Human review of plans: the console reviewer, review policies, and pausing for outside review.

- :class:`ConsoleReviewer`: approve, edit in ``$EDITOR``, reject with a reason, or quit (pause).
- :class:`ReviewPolicy` and :class:`PolicyApprover`: which plans a person sees (the root plan,
  every level, or sub-goals whose budget exceeds a threshold); the rest are approved.
- :class:`PauseForReview`: defers every plan it gets, so the run pauses and is continued later
  with ``hierplan resume`` (:func:`hierplan.resume`).

For a reviewer elsewhere (a chat, a ticket, a web page), use
:class:`~hierplan.hierarchy.gate.CallbackApprover` with an async function.
"""

from __future__ import annotations

from hierplan.review.console import ConsoleReviewer
from hierplan.review.policy import PauseForReview, PolicyApprover, ReviewPolicy

__all__ = ["ConsoleReviewer", "PauseForReview", "PolicyApprover", "ReviewPolicy"]
