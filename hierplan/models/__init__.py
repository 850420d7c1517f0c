"""Models: the protocol, test doubles, and provider adapters.

:func:`provider_model` turns a provider's model string into a :class:`Model`:
``openai:<name>`` or ``anthropic:<name>`` (adapters loaded on demand, so that an import problem
gives a clear message). This layer knows nothing of plans, budgets, tracing or runs; the
offline simulator lives in :mod:`hierplan.simulator`.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from hierplan.errors import ModelNotAvailableError
from hierplan.models.base import (
    Message,
    Model,
    ModelRequest,
    ModelResponse,
    ModelString,
    OutputSchema,
    StreamingModel,
    StreamItem,
    ToolCall,
    ToolSpec,
    parse_model_string,
    stream_of,
)
from hierplan.models.scripted import FunctionModel, ScriptedModel, StreamedText
from hierplan.units import Usage

_ADAPTERS: Mapping[str, tuple[str, str, str]] = {
    "openai": ("hierplan.models.openai", "OpenAIModel", "openai"),
    "anthropic": ("hierplan.models.anthropic", "AnthropicModel", "anthropic"),
}
_ADAPTERS = MappingProxyType(_ADAPTERS)  # read-only: shared by every run


def provider_model(spec: str, *, priced_as: str | None = None, **provider_options: Any) -> Model:
    """The adapter for a provider's model string (``openai:<name>``, ``anthropic:<name>``),
    built with ``provider_options`` (``base_url``, ``api_key``, ``timeout_s``, ...): see
    :class:`hierplan.models.openai.OpenAIModel` and
    :class:`hierplan.models.anthropic.AnthropicModel`. A missing API key raises
    :class:`~hierplan.errors.ModelNotAvailableError` naming the variable to set.
    """
    parsed = parse_model_string(spec)
    if parsed.provider not in _ADAPTERS:
        raise ModelNotAvailableError(
            f"model {spec!r} is not a provider's model: use openai:<model> or anthropic:<model>"
        )
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
    "FunctionModel",
    "Message",
    "Model",
    "ModelRequest",
    "ModelResponse",
    "ModelString",
    "OutputSchema",
    "ScriptedModel",
    "StreamItem",
    "StreamedText",
    "StreamingModel",
    "ToolCall",
    "ToolSpec",
    "Usage",
    "parse_model_string",
    "provider_model",
    "stream_of",
]
