"""Check tool arguments against a tool's JSON schema, as a model reads that schema.

pydantic's lax mode turns ``"1"`` into ``1`` and ``True`` into ``1``, which the schema a model
sees forbids; a model that sends them has made a malformed call it should hear about. This
checks the JSON form of the arguments against the subset of JSON Schema (draft 2020-12) that
pydantic's ``model_json_schema`` produces: ``type``, ``enum``, ``const``, ``properties``,
``required``, ``additionalProperties``, ``items``, ``prefixItems``, ``minItems``,
``maxItems``, ``uniqueItems``, ``anyOf``, ``oneOf``, ``allOf``, local ``$ref``, the numeric
bounds, ``minLength``, ``maxLength`` and ``pattern``. Other keywords are not checked (the tool's
own validation still runs), so a schema using them is never refused wrongly.

>>> schema_problems({"type": "object", "properties": {"n": {"type": "integer"}}}, {"n": "1"})
["n: expected integer, got string '1'"]
"""

from __future__ import annotations

import math
import operator
import re
import uuid
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Literal

from pydantic_core import PydanticSerializationError, to_jsonable_python

# A JSON Schema type, and the check that a JSON value is of it. An integer-valued float is an
# integer, as JSON Schema says (JSON has one kind of number); a bool is neither.
_TYPE_CHECKS: Mapping[str, Callable[[Any], bool]] = MappingProxyType(
    {
        "null": lambda v: v is None,
        "boolean": lambda v: isinstance(v, bool),
        "integer": lambda v: (
            (isinstance(v, int) and not isinstance(v, bool))
            or (isinstance(v, float) and v.is_integer())
        ),
        "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "string": lambda v: isinstance(v, str),
        "array": lambda v: isinstance(v, list),
        "object": lambda v: isinstance(v, dict),
    }
)


# The numeric bounds: a keyword, whether a value keeps to it, and how a problem words it.
_BOUNDS: tuple[tuple[str, Callable[[Any, Any], bool], str], ...] = (
    ("minimum", operator.ge, "at least"),
    ("maximum", operator.le, "at most"),
    ("exclusiveMinimum", operator.gt, "more than"),
    ("exclusiveMaximum", operator.lt, "less than"),
)


def _anything(value: Any) -> bool:
    """The check of a type this does not know: the tool's own validation judges."""
    return True


class _Opaque:
    """A value with no JSON form (an object a reference passed on): only an empty schema
    (``Any``) takes it, and its text is that of the value."""

    def __init__(self, value: Any) -> None:
        self.text = type(value).__name__

    def __repr__(self) -> str:
        return f"<{self.text}>"


def json_form(value: Any) -> Any:
    """``value`` as JSON would carry it: tuples as lists, models and dataclasses as objects;
    a part with no JSON form stands as an opaque value that only an empty schema takes."""
    try:
        return to_jsonable_python(value)
    except PydanticSerializationError:
        pass
    # pydantic serializes what a fallback returns again, so the fallback cannot return the
    # opaque value itself: it returns a token made for this call, put back once it is done.
    tokens: dict[str, _Opaque] = {}
    prefix = f"\x00opaque-{uuid.uuid4().hex}-"

    def fallback(part: Any) -> str:
        token = f"{prefix}{len(tokens)}"
        tokens[token] = _Opaque(part)
        return token

    return _untokened(to_jsonable_python(value, fallback=fallback), tokens)


def _untokened(form: Any, tokens: dict[str, _Opaque]) -> Any:
    """``form`` with each token of :func:`json_form` back as its opaque value (a key of an
    object, which must stay text, as the value's text, numbered when another key has it)."""
    if isinstance(form, str):
        return tokens.get(form, form)
    if isinstance(form, list):
        return [_untokened(item, tokens) for item in form]
    if not isinstance(form, dict):
        return form
    out: dict[str, Any] = {}
    for key, item in form.items():
        if key in tokens:
            text = key = repr(tokens[key])
            n = 1
            while key in out or key in form:
                n += 1
                key = f"{text}#{n}"
        out[key] = _untokened(item, tokens)
    return out


def schema_problems(
    schema: Mapping[str, Any], value: Any, path: str = "", *, limit: int = 10
) -> list[str]:
    """What makes ``value`` (in its JSON form) fail ``schema``, as ``"<path>: <what>"`` (the
    path of keys and indexes joined by ".", "arguments" for the value itself), at most
    ``limit`` of them; empty when it passes."""
    try:
        form = json_form(value)
    except ValueError as exc:  # a cycle, nesting past the serializer's depth, bytes not UTF-8
        return [f"{_where(path)}: has no JSON form: {exc}"]
    out: list[str] = []
    _check(schema, form, path, schema, out, limit)
    return out


def _at(path: str, key: str | int) -> str:
    return f"{path}.{key}" if path else str(key)


def _where(path: str) -> str:
    return path or "arguments"


def _kind(value: Any) -> str:
    if isinstance(value, _Opaque):
        return value.text
    for name in ("null", "boolean", "integer", "number", "string", "array", "object"):
        if _TYPE_CHECKS[name](value):
            return name
    return type(value).__name__


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _resolve(
    schema: Mapping[str, Any], root: Mapping[str, Any]
) -> Mapping[str, Any] | Literal[False] | None:
    """Follow a local ``$ref`` ("#/$defs/Name"); ``False`` for one to the schema ``false``,
    ``None`` for one that leads nowhere."""
    ref = schema.get("$ref")
    seen = 0
    while isinstance(ref, str):
        if not ref.startswith("#") or seen > 32:  # a remote ref, or a cycle of refs
            return None
        target: Any = root
        for part in filter(None, ref[1:].split("/")):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, Mapping) or part not in target:
                return None
            target = target[part]
        if isinstance(target, bool):  # the schema true or false
            return {} if target else False
        if not isinstance(target, Mapping):
            return None
        # Keywords beside "$ref" apply as well (2020-12); pydantic puts a default there.
        schema = {**{k: v for k, v in schema.items() if k != "$ref"}, **target}
        ref = target.get("$ref")
        seen += 1
    return schema


def _check(
    schema: Any, value: Any, path: str, root: Mapping[str, Any], out: list[str], limit: int
) -> None:
    if schema is False:
        out.append(f"{_where(path)}: no value is allowed here")
        return
    if len(out) >= limit or not isinstance(schema, Mapping):
        return  # the schema true: anything goes
    resolved = _resolve(schema, root) if "$ref" in schema else schema
    if resolved is None:
        return  # a reference this cannot follow: the tool's own validation judges
    if resolved is False:
        out.append(f"{_where(path)}: no value is allowed here")
        return
    schema = resolved
    if not _check_type(schema, value, path, out):
        return  # the other keywords would only repeat it
    if "enum" in schema and not any(_same(value, e) for e in schema["enum"]):
        choices = ", ".join(_shown(e) for e in schema["enum"])
        out.append(f"{_where(path)}: expected one of {choices}, got {_shown(value)}")
    if "const" in schema and not _same(value, schema["const"]):
        out.append(f"{_where(path)}: expected {_shown(schema['const'])}, got {_shown(value)}")
    _check_alternatives(schema, value, path, root, out, limit)
    if isinstance(value, dict):
        _check_object(schema, value, path, root, out, limit)
    elif isinstance(value, list):
        _check_array(schema, value, path, root, out, limit)
    elif isinstance(value, str):
        _check_string(schema, value, path, out)
    elif _TYPE_CHECKS["number"](value):
        _check_number(schema, value, path, out)


def _check_type(schema: Mapping[str, Any], value: Any, path: str, out: list[str]) -> bool:
    wanted = schema.get("type")
    if wanted is None:
        return True
    if isinstance(wanted, str):  # the usual case, one type: no list and no generator
        if _TYPE_CHECKS.get(wanted, _anything)(value):
            return True
        names = [wanted]
    else:
        names = list(wanted)
        if any(_TYPE_CHECKS.get(n, _anything)(value) for n in names):
            return True
    expected = " or ".join(names)
    out.append(f"{_where(path)}: expected {expected}, got {_kind(value)} {_shown(value)}")
    return False


def _same(a: Any, b: Any) -> bool:
    """Equality as JSON Schema has it: ``1 == 1.0``, but ``True`` is not ``1``."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, int | float) and isinstance(b, int | float):
        return bool(a == b)
    return type(a) is type(b) and bool(a == b)


def _check_alternatives(
    schema: Mapping[str, Any],
    value: Any,
    path: str,
    root: Mapping[str, Any],
    out: list[str],
    limit: int,
) -> None:
    for sub in schema.get("allOf", ()):
        _check(sub, value, path, root, out, limit)
    for keyword in ("anyOf", "oneOf"):
        if keyword not in schema:
            continue
        options = list(schema[keyword])
        failures = []
        for sub in options:
            found: list[str] = []
            _check(sub, value, path, root, found, limit)
            failures.append(found)
        passed = sum(1 for f in failures if not f)
        if keyword == "oneOf" and passed > 1:
            out.append(f"{_where(path)}: matches {passed} of the choices, where one is allowed")
        elif passed == 0:
            # A choice the value got past the top of (an object for Point | None) is the
            # one meant: its own problems say what to fix, and where.
            here = f"{_where(path)}: "
            meant = [f for f in failures if not all(p.startswith(here) for p in f)]
            if len(meant) == 1:
                out.extend(meant[0])
                continue
            # Else each choice's first problem: together they say every type that would do.
            reasons = " | ".join(f[0].removeprefix(here) for f in failures if f)
            out.append(f"{here}no choice matches ({reasons})")


def _check_object(
    schema: Mapping[str, Any],
    value: dict[str, Any],
    path: str,
    root: Mapping[str, Any],
    out: list[str],
    limit: int,
) -> None:
    props = schema.get("properties", {})
    for name in schema.get("required", ()):
        if name not in value:
            out.append(f"{_at(path, name)}: missing (it is required)")
    extra = schema.get("additionalProperties", True)
    for key, item in value.items():
        if key in props:
            _check(props[key], item, _at(path, key), root, out, limit)
        elif extra is False:
            known = ", ".join(props) or "none"
            out.append(f"{_at(path, key)}: unexpected argument (the known ones: {known})")
        else:
            _check(extra, item, _at(path, key), root, out, limit)


def _check_array(
    schema: Mapping[str, Any],
    value: list[Any],
    path: str,
    root: Mapping[str, Any],
    out: list[str],
    limit: int,
) -> None:
    prefix = schema.get("prefixItems", ())
    for index, item in enumerate(value):
        sub = prefix[index] if index < len(prefix) else schema.get("items", True)
        if sub is False:
            out.append(f"{_at(path, index)}: unexpected item (at most {len(prefix)} items)")
        else:
            _check(sub, item, _at(path, index), root, out, limit)
    if "minItems" in schema and len(value) < schema["minItems"]:
        out.append(
            f"{_where(path)}: expected at least {schema['minItems']} items, got {len(value)}"
        )
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        out.append(f"{_where(path)}: expected at most {schema['maxItems']} items, got {len(value)}")
    if schema.get("uniqueItems") and any(
        _same(a, b) for i, a in enumerate(value) for b in value[i + 1 :]
    ):
        out.append(f"{_where(path)}: expected items that are all different")


def _check_string(schema: Mapping[str, Any], value: str, path: str, out: list[str]) -> None:
    if "minLength" in schema and len(value) < schema["minLength"]:
        out.append(f"{_where(path)}: expected at least {schema['minLength']} characters")
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        out.append(f"{_where(path)}: expected at most {schema['maxLength']} characters")
    pattern = schema.get("pattern")
    if isinstance(pattern, str):
        try:
            matched = re.search(pattern, value) is not None
        except re.error:
            return  # a pattern Python's re cannot read: the tool judges
        if not matched:
            out.append(f"{_where(path)}: expected a string matching {pattern!r}")


def _check_number(schema: Mapping[str, Any], value: float, path: str, out: list[str]) -> None:
    if math.isnan(value):
        return  # compares with nothing, as in JSON Schema validators
    for keyword, holds, words in _BOUNDS:
        bound = schema.get(keyword)
        if bound is None:
            continue
        if (
            isinstance(bound, int | float)
            and not isinstance(bound, bool)
            and not holds(value, bound)
        ):
            out.append(f"{_where(path)}: expected a number {words} {bound}, got {value}")
