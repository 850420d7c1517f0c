"""hierplan.core.results."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass


@dataclass(slots=True, frozen=True)
class StepResult:
    """What a step produced: its raw ``output`` and that output as ``text``."""

    output: Any
    text: str
