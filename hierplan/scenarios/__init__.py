"""Built-in scenarios for the offline default (and for real models: the same tools)."""

from __future__ import annotations

from hierplan.errors import UnknownScenarioError
from hierplan.scenarios.base import Scenario, ScenarioEnv, Verification


def scenarios() -> dict[str, Scenario]:
    """Every built-in scenario by name."""
    from hierplan.scenarios.data_migration import DataMigration

    found: list[Scenario] = [DataMigration()]
    return {s.name: s for s in found}


def get_scenario(name: str) -> Scenario:
    """The scenario called ``name``; a clear error lists the known ones."""
    known = scenarios()
    try:
        return known[name]
    except KeyError:
        raise UnknownScenarioError(
            f"unknown scenario {name!r}: choose one of {', '.join(sorted(known))}"
        ) from None


__all__ = ["Scenario", "ScenarioEnv", "Verification", "get_scenario", "scenarios"]
