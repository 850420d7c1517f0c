"""Models: the protocol, the offline simulator, test doubles, and provider adapters.

:func:`resolve_model` turns a model string into a :class:`Model`: ``sim`` (the simulator, which
needs an oracle), ``openai:<name>`` or ``anthropic:<name>`` (provider adapters, loaded on demand
so that an import problem gives a clear message).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from hierplan.agents.models.base import (
    Message,
    Model,
    ModelRequest,
    ModelResponse,
    ModelString,
    OutputSchema,
    ToolCall,
    ToolSpec,
    Usage,
    parse_model_string,
)
from hierplan.agents.models.scripted import FunctionModel, ScriptedModel
from hierplan.agents.models.simulated import (
    PROFILES,
    Action,
    NoiseProfile,
    Oracle,
    SimulatedModel,
)
from hierplan.errors import ModelNotAvailableError

_ADAPTERS: Mapping[str, tuple[str, str, str]] = {
    "openai": ("hierplan.agents.models.openai", "OpenAIModel", "openai"),
    "anthropic": ("hierplan.agents.models.anthropic", "AnthropicModel", "anthropic"),
}
_ADAPTERS = MappingProxyType(_ADAPTERS)  # read-only: shared by every run


def resolve_model(
    spec: str | Model,
    *,
    oracle: Oracle | None = None,
    profile: NoiseProfile | str = "typical",
    seed: int = 0,
    latency_scale: float = 1.0,
    priced_as: str | None = None,
    **provider_options: Any,
) -> Model:
    """A :class:`Model` for ``spec`` (a model string or a model, returned as is).

    ``sim`` builds a :class:`SimulatedModel` on ``oracle`` (``sim:<model>`` prices it as that
    model); provider strings build their adapter with ``provider_options`` (``base_url``,
    ``api_key``, ``timeout_s``, ``priced_as``): see :class:`hierplan.agents.models.openai.
    OpenAIModel` and :class:`hierplan.agents.models.anthropic.AnthropicModel`. A missing API key
    raises :class:`~hierplan.errors.ModelNotAvailableError` naming the variable to set.
    """
    if not isinstance(spec, str):
        return spec
    parsed = parse_model_string(spec)
    if parsed.provider == "sim":
        kwargs: dict[str, Any] = {"profile": profile, "seed": seed, "latency_scale": latency_scale}
        if parsed.name or priced_as:
            kwargs["priced_as"] = parsed.name or priced_as
        return SimulatedModel(oracle, **kwargs)
    module_name, class_name, package = _ADAPTERS[parsed.provider]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            raise ModelNotAvailableError(
                f"the {parsed.provider} adapter is not part of this hierplan installation"
            ) from None
        raise ModelNotAvailableError(
            f"model {spec!r} needs the {package!r} package ({exc}); install it with "
            f"'pip install {package}'"
        ) from None
    except ImportError as exc:
        raise ModelNotAvailableError(
            f"model {spec!r} cannot load the {package!r} package ({exc}); upgrade it with "
            f"'pip install -U {package}'"
        ) from None
    if priced_as:
        provider_options["priced_as"] = priced_as
    cls = getattr(module, class_name)
    accepted = [p for p in inspect.signature(cls).parameters if p != "model_name"]
    unknown = sorted(set(provider_options) - set(accepted))
    if unknown:
        raise ModelNotAvailableError(
            f"model {spec!r}: unknown model option(s) {', '.join(unknown)}; the options are "
            f"{', '.join(accepted)}"
        )
    adapter: Model = cls(parsed.name, **provider_options)
    return adapter


__all__ = [
    "PROFILES",
    "Action",
    "FunctionModel",
    "Message",
    "Model",
    "ModelRequest",
    "ModelResponse",
    "ModelString",
    "NoiseProfile",
    "Oracle",
    "OutputSchema",
    "ScriptedModel",
    "SimulatedModel",
    "ToolCall",
    "ToolSpec",
    "Usage",
    "parse_model_string",
    "resolve_model",
]
