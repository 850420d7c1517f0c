"""JSON schemas rewritten for strict structured output, and the model's output read back.

OpenAI's strict structured outputs accept a subset of JSON Schema: every object must list all of
its properties as required and forbid others, and some keywords are rejected. :func:`strict_schema`
rewrites a schema into that subset without losing what it says, and :func:`decode_strict` turns
output that follows the rewritten schema back into data the original schema (and pydantic)
accepts:

- an optional property becomes required but nullable; a ``null`` the model sends for it means
  "left out" and is removed again, so the field takes its default;
- an open object (free-form keys, such as a plan step's tool ``args``) cannot be expressed in
  strict mode; it becomes a string holding JSON, parsed back on the way in;
- keywords strict mode rejects (``minLength``, ``maxLength``, ...) move into the description,
  so the model still reads them; pydantic checks them after decoding;
- ``title`` and ``default`` are dropped, ``oneOf`` becomes ``anyOf``.

>>> s = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
...      "required": ["a"]}
>>> strict_schema(s)["required"], strict_schema(s)["properties"]["b"]
(['a', 'b'], {'anyOf': [{'type': 'integer'}, {'type': 'null'}]})
>>> decode_strict(s, {"a": "x", "b": None})
{'a': 'x'}
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

# Keywords OpenAI's strict mode rejects; they are kept as words in the description.
_UNSUPPORTED = (
    "minLength",
    "maxLength",
    "patternProperties",
    "unevaluatedProperties",
    "propertyNames",
    "minProperties",
    "maxProperties",
    "unevaluatedItems",
    "contains",
    "minContains",
    "maxContains",
    "uniqueItems",
)
_DROPPED = ("title", "default", "$schema", "discriminator", "examples")
_STRING_FORMATS = frozenset(
    {"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"}
)
_LOOKAROUND = ("(?=", "(?!", "(?<=", "(?<!")
JSON_STRING_NOTE = "A JSON object written as a string."

Schema = Mapping[str, Any]


def is_open_object(schema: Schema) -> bool:
    """Whether ``schema`` is an object whose keys are free (no ``properties`` to list)."""
    return (
        schema.get("type") == "object"
        and not schema.get("properties")
        and schema.get("additionalProperties", True) is not False
    )


def strict_schema(schema: Schema) -> dict[str, Any]:
    """``schema`` rewritten for strict structured output (see the module docstring).

    Raises ``ValueError`` when the root is not an object, which strict mode requires.
    """
    if schema.get("type") != "object" or is_open_object(schema):
        raise ValueError("strict structured output needs an object with properties at the root")
    return _strict(schema)


def _strict(schema: Schema) -> dict[str, Any]:
    if "$ref" in schema:
        siblings = {k: v for k, v in schema.items() if k not in ("$ref", *_DROPPED)}
        if not siblings:
            return {"$ref": schema["$ref"]}
        # strict mode allows no keywords next to "$ref", but does next to "anyOf"
        return {**_strict(siblings), "anyOf": [{"$ref": schema["$ref"]}]}
    if is_open_object(schema):
        return _described({"type": "string"}, schema.get("description"), JSON_STRING_NOTE)
    out: dict[str, Any] = {}
    notes: list[str] = []
    for key, value in schema.items():
        if key in _DROPPED:
            continue
        if key in _UNSUPPORTED or (key == "format" and value not in _STRING_FORMATS):
            notes.append(f"{key}={json.dumps(value)}")
        elif key == "pattern" and any(token in str(value) for token in _LOOKAROUND):
            notes.append(f"pattern={json.dumps(value)}")
        elif key == "$defs":
            out[key] = {name: _strict(sub) for name, sub in value.items()}
        elif key == "items" and isinstance(value, Mapping):
            out[key] = _strict(value)
        elif key in ("anyOf", "oneOf"):
            out["anyOf"] = [_strict(sub) for sub in value]
        elif key == "allOf" and len(value) == 1:
            out.update(_strict(value[0]))
        elif key == "allOf":
            out[key] = [_strict(sub) for sub in value]
        elif key not in ("properties", "required", "additionalProperties"):
            out[key] = value
    properties = schema.get("properties")
    if schema.get("type") == "object" and isinstance(properties, Mapping):
        required = set(schema.get("required", ()))
        out["properties"] = {
            name: _strict(sub) if name in required else _nullable(_strict(sub))
            for name, sub in properties.items()
        }
        out["required"] = list(properties)
        out["additionalProperties"] = False
    return _described(out, out.pop("description", None), *notes) if notes else out


def _described(schema: dict[str, Any], description: Any, *notes: str) -> dict[str, Any]:
    text = " ".join(str(part) for part in (description, *notes) if part)
    if text:
        schema["description"] = text
    return schema


def is_nullable(schema: Schema) -> bool:
    """Whether ``schema`` admits ``null`` (directly or through ``anyOf``)."""
    kind = schema.get("type")
    if kind == "null" or (isinstance(kind, list) and "null" in kind):
        return True
    return any(
        isinstance(sub, Mapping) and is_nullable(sub)
        for sub in (*schema.get("anyOf", ()), *schema.get("oneOf", ()))
    )


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    if is_nullable(schema):
        return schema
    description = schema.pop("description", None)
    inner = schema["anyOf"] if set(schema) == {"anyOf"} else [schema]
    return _described({"anyOf": [*inner, {"type": "null"}]}, description)


Decoder = Callable[[Any], Any]


def decode_strict(schema: Schema, value: Any) -> Any:
    """Output that follows ``strict_schema(schema)`` as data that follows ``schema``.

    Nulls sent for optional, non-nullable properties are removed and JSON strings standing for
    open objects are parsed. Anything unexpected is passed through unchanged for the validator
    to report. To decode many outputs of one schema, build the decoder once with
    :func:`strict_decoder`.
    """
    return strict_decoder(schema)(value)


def strict_decoder(schema: Schema) -> Decoder:
    """A function doing :func:`decode_strict` for ``schema``, compiled once (the planner's
    hot path decodes every plan with it)."""
    return _Compiler(schema).compile(schema) or _identity


def _identity(value: Any) -> Any:
    return value


class _Compiler:
    """Turns a schema into nested decoding closures; ``None`` means "nothing to do here"."""

    def __init__(self, root: Schema) -> None:
        self.root = root
        self.refs: dict[str, Decoder | None] = {}

    def resolve(self, schema: Schema) -> Schema:
        seen = 0
        while "$ref" in schema and seen < 32:
            target: Any = self.root
            ref = str(schema["$ref"])
            for part in ref.removeprefix("#/").split("/") if ref != "#" else ():
                target = target.get(part, {}) if isinstance(target, Mapping) else {}
            schema = target if isinstance(target, Mapping) else {}
            seen += 1
        return schema

    def compile(self, schema: Schema) -> Decoder | None:
        if "$ref" in schema:
            return self._ref(str(schema["$ref"]))
        branches = [*schema.get("anyOf", ()), *schema.get("oneOf", ())]
        if branches:
            return self._union(branches)
        if is_open_object(schema):
            return _parse_object
        properties = schema.get("properties")
        if isinstance(properties, Mapping):
            return self._object(properties, set(schema.get("required", ())))
        items = schema.get("items")
        if isinstance(items, Mapping):
            item = self.compile(items)
            if item is not None:
                return lambda value: [item(v) for v in value] if isinstance(value, list) else value
        return None

    def _ref(self, ref: str) -> Decoder | None:
        if ref in self.refs:  # recursive schemas: the decoder refers to itself
            return lambda value: (self.refs[ref] or _identity)(value)
        self.refs[ref] = None
        self.refs[ref] = self.compile(self.resolve({"$ref": ref}))
        return self.refs[ref]

    def _union(self, branches: list[Schema]) -> Decoder | None:
        options = [(_type_check(self.resolve(b)), self.compile(b)) for b in branches]
        if all(decoder is None for _, decoder in options):
            return None

        def decode(value: Any) -> Any:
            for fits, decoder in options:
                if fits(value):
                    return value if decoder is None else decoder(value)
            return value

        return decode

    def _object(self, properties: Mapping[str, Any], required: set[str]) -> Decoder:
        fields: dict[str, tuple[Decoder | None, bool]] = {}
        for name, sub in properties.items():
            optional_not_null = name not in required and not is_nullable(self.resolve(sub))
            fields[name] = (self.compile(sub), optional_not_null)

        def decode(value: Any) -> Any:
            if not isinstance(value, dict):
                return value
            out: dict[str, Any] = {}
            for key, item in value.items():
                decoder, drop_null = fields.get(key, (None, False))
                if item is None and drop_null:
                    continue
                out[key] = item if decoder is None or item is None else decoder(item)
            return out

        return decode


def _parse_object(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        return value
    return parsed if isinstance(parsed, dict) else value


_CHECKS: Mapping[str, Callable[[Any], bool]] = {
    "null": lambda v: v is None,
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
}
_CHECKS = MappingProxyType(_CHECKS)  # read-only: shared by every run


def _type_check(schema: Schema) -> Callable[[Any], bool]:
    """Whether a value has the JSON type ``schema`` names (an open object fits a string)."""
    if "anyOf" in schema or "oneOf" in schema or "type" not in schema:
        return lambda value: True
    if is_open_object(schema):
        return lambda value: isinstance(value, str | dict)
    kind = schema["type"]
    checks = [_CHECKS[k] for k in (kind if isinstance(kind, list) else [kind]) if k in _CHECKS]
    return lambda value: any(check(value) for check in checks)
