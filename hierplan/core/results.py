"""What a step produced (:class:`StepResult`): handed to the steps that depend on it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(slots=True, frozen=True)
class StepResult:
    """What a step produced: its raw ``output`` and that output as ``text``."""

    output: Any
    text: str
