"""Tools: functions that executors call, with validated arguments and a timeout.

``@tool`` turns a function into a :class:`Tool`: its signature becomes a pydantic model, whose JSON
schema is what models see; arguments are validated before the function runs; sync functions run
in a worker thread so they never block the event loop; every call has a timeout. A generator
(sync or async) returns the list of what it yields.

>>> @tool
... def add(a: int, b: int) -> int:
...     '''Add two integers.'''
...     return a + b
>>> add.name, sorted(add.parameters["properties"])
('add', ['a', 'b'])

A sync tool that times out is abandoned, not killed: Python cannot stop a thread, so the
function runs on in the background while the step fails with :class:`ToolTimeoutError`.
"""

from __future__ import annotations

import inspect
import json
import re
import sys
import warnings
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from functools import partial
from typing import Annotated, Any, overload

import anyio
import anyio.to_thread
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PydanticUserError,
    TypeAdapter,
    ValidationError,
    create_model,
)
from pydantic_core import to_jsonable_python

from hierplan.errors import (
    MAX_LISTED_PROBLEMS,
    DuplicateToolError,
    ToolArgsError,
    ToolError,
    ToolNotAllowedError,
    ToolTimeoutError,
    UserInputError,
    field_problems,
    is_positive_seconds,
)
from hierplan.models.base import ToolSpec
from hierplan.tools.schema import schema_problems

DEFAULT_TOOL_TIMEOUT_S = 60.0
# anyio's default limit of worker threads (per event loop), which sync tools share.
DEFAULT_TOOL_THREADS = 40
_tool_threads: ContextVar[anyio.CapacityLimiter | None] = ContextVar(
    "hierplan_tool_threads", default=None
)
# The function names OpenAI and Anthropic both accept: a tool named otherwise runs offline
# but a real model's first request would be refused.
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


@dataclass(slots=True, frozen=True)
class ToolHints:
    """What a tool says of its effects, as MCP's tool annotations say it: ``read_only`` (it
    changes nothing), ``destructive`` (it may delete or overwrite), ``idempotent`` (calling it
    again with the same arguments does nothing more), ``open_world`` (it reaches outside
    systems). ``None``: not said. Plan review shows them, and the review policy
    ``destructive`` sends a plan that may use a destructive tool to a person.

    >>> ToolHints().may_destroy, ToolHints(read_only=True).may_destroy
    (True, False)
    """

    read_only: bool | None = None
    destructive: bool | None = None
    idempotent: bool | None = None
    open_world: bool | None = None

    @property
    def may_destroy(self) -> bool:
        """Whether the tool may be destructive: unless it says it is read-only or not
        destructive (MCP's defaults: a tool that says nothing may be)."""
        return not self.read_only and self.destructive is not False

    def label(self) -> str:
        """``read-only``, ``destructive`` or ``""`` (not said), for plan review."""
        if self.read_only:
            return "read-only"
        if self.destructive:
            return "destructive"
        return "not destructive" if self.destructive is False else ""


class Tool(ABC):
    """A callable tool with a name, a description, a JSON schema and a timeout.

    Subclasses implement :meth:`invoke`; :meth:`call` adds validation and the timeout.
    ``timeout_s`` is in seconds, more than 0 (``math.inf`` for no deadline). ``hints`` says
    what the tool does to the world (:class:`ToolHints`); ``source`` where it comes from (an
    MCP server's name, a Python module), for listings and error messages.
    """

    def __init__(
        self,
        name: str,
        description: str,
        parameters: Mapping[str, Any],
        *,
        timeout_s: float = DEFAULT_TOOL_TIMEOUT_S,
        hints: ToolHints | None = None,
        source: str | None = None,
    ) -> None:
        if not is_positive_seconds(timeout_s):
            raise UserInputError(
                f"tool {name!r}: timeout_s must be a number of seconds more than 0 "
                f"(math.inf for no deadline), not {timeout_s!r}"
            )
        self.name = name
        self.description = description
        self.parameters = dict(parameters)
        self.timeout_s = timeout_s
        self.hints = hints or ToolHints()
        self.source = source
        self.spec = ToolSpec(name, description, self.parameters)

    def validate(self, arguments: Mapping[str, Any]) -> Mapping[str, Any]:
        """Check ``arguments`` against :attr:`parameters` and return them in the form
        :meth:`invoke` takes; raise :class:`ToolArgsError` naming each bad argument."""
        self._check_schema(arguments)
        return arguments

    def _check_schema(self, arguments: Mapping[str, Any]) -> None:
        """Raise :class:`ToolArgsError` unless ``arguments`` is an object the schema allows."""
        if not isinstance(arguments, Mapping):
            raise ToolArgsError(
                f"tool {self.name!r} takes an object of arguments, got {type(arguments).__name__}"
            )
        problems = schema_problems(self.parameters, dict(arguments), limit=sys.maxsize)
        if problems:
            # At most ten: the message goes back to the model, and a list of thousands of bad
            # items would cost its tokens on every later turn.
            listed = "; ".join(problems[:MAX_LISTED_PROBLEMS])
            if len(problems) > MAX_LISTED_PROBLEMS:
                listed += f"; and {len(problems) - MAX_LISTED_PROBLEMS} more"
            raise ToolArgsError(f"invalid arguments for tool {self.name!r}: {listed}")

    @abstractmethod
    async def invoke(self, arguments: Mapping[str, Any]) -> Any:
        """Run the tool on validated arguments."""

    def validate_references(self, arguments: Mapping[str, Any]) -> Mapping[str, Any]:
        """Like :meth:`validate`, for arguments that hold the outputs of earlier steps a plan
        referred to (``$id``): those are a step's result, not a model's typing, so a tool that
        can convert them (a ``@tool`` function's "42" to an int) does. By default, what
        :meth:`validate` does when a subclass defines it, else only the check for an object."""
        if type(self).validate is not Tool.validate:
            return self.validate(arguments)
        if not isinstance(arguments, Mapping):
            self._check_schema(arguments)  # raises, saying what the tool takes
        return arguments

    async def call(
        self, arguments: Mapping[str, Any], *, references: bool = False, checked: bool = False
    ) -> Any:
        """Validate ``arguments``, then run the tool under its timeout. ``references``: the
        arguments hold outputs of earlier steps (see :meth:`validate_references`);
        ``checked``: :meth:`validate` passed them already (the plan gate's check), so only
        what :meth:`validate_references` does is done again, not the schema check."""
        if references or checked:
            valid = self.validate_references(arguments)
        else:
            valid = self.validate(arguments)
        # move_on_after, not fail_after: a TimeoutError the tool raises itself (a client's own
        # timeout, say) is its failure with its own message, not this deadline running out.
        with anyio.move_on_after(self.timeout_s):
            return await self.invoke(valid)
        raise ToolTimeoutError(f"tool {self.name!r} did not finish within {self.timeout_s:g} s")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


class FunctionTool(Tool):
    """A tool made from a Python function by :func:`tool`."""

    def __init__(
        self,
        function: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        timeout_s: float = DEFAULT_TOOL_TIMEOUT_S,
        hints: ToolHints | None = None,
    ) -> None:
        self.function = function
        self.is_async = inspect.iscoroutinefunction(function)
        chosen = _tool_name(function, name)
        self.args_model, self._fields, self._positional = _args_model(function, chosen)
        try:
            schema = self.args_model.model_json_schema()
        except PydanticUserError:  # a type with a pydantic schema but no JSON one
            _refuse_unschemable(function, chosen)
            raise
        if description is None:
            description = _doc(function).split("\n\n")[0].strip()
            if not description:
                # The description is all a model knows of when to call the tool.
                warnings.warn(
                    f"tool {chosen!r} has no description: give its function a docstring, or "
                    "pass tool(description=...), so that a model knows what it does",
                    UserWarning,
                    stacklevel=_caller_level(),
                )
        super().__init__(chosen, description, schema, timeout_s=timeout_s, hints=hints)

    def validate(self, arguments: Mapping[str, Any]) -> Mapping[str, Any]:
        """Check against the schema the model sees, then validate through the signature's
        pydantic model (which makes dates, enums and models of their JSON); errors name each
        bad field."""
        # pydantic alone would take "1" or true for an integer, which the schema forbids.
        self._check_schema(arguments)
        return self._convert(arguments)

    def validate_references(self, arguments: Mapping[str, Any]) -> Mapping[str, Any]:
        """Validate through the signature's pydantic model alone, which converts what it can
        (a step's text "42" to an int parameter)."""
        if not isinstance(arguments, Mapping):
            self._check_schema(arguments)  # raises, saying what the tool takes
        return self._convert(arguments)

    def _convert(self, arguments: Mapping[str, Any]) -> Mapping[str, Any]:
        try:
            model = self.args_model.model_validate(dict(arguments))
        except ValidationError as exc:
            # At most ten problems: the message goes back to the model, and a list of
            # thousands of bad items would cost its tokens on every later turn.
            problems = field_problems(exc, "arguments")
            raise ToolArgsError(f"invalid arguments for tool {self.name!r}: {problems}") from None
        except Exception as exc:
            # pydantic turns only ValueError and AssertionError into a ValidationError; a
            # validator of the tool's own types may raise anything else (a KeyError, say), and
            # the plan gate and the executor expect a ToolArgsError, not a crash.
            raise ToolArgsError(
                f"invalid arguments for tool {self.name!r}: {type(exc).__name__}: {exc}"
            ) from exc
        return {param: getattr(model, field) for field, param in self._fields.items()}

    async def invoke(self, arguments: Mapping[str, Any]) -> Any:
        """Await an async function; run a sync one in a worker thread (and await what it
        returns if that is awaitable). A generator's result is the list of what it yields."""
        kwargs = dict(arguments)
        args: list[Any] = []
        for param in self._positional:  # in order, up to the first one left to its default
            if param not in kwargs:
                break
            args.append(kwargs.pop(param))
        if self.is_async:
            result: Any = await self.function(*args, **kwargs)
            return result
        if inspect.isasyncgenfunction(self.function):
            return [item async for item in self.function(*args, **kwargs)]
        result = await anyio.to_thread.run_sync(
            partial(_collected, self.function, *args, **kwargs),
            abandon_on_cancel=True,
            limiter=_tool_threads.get(),
        )
        # A sync wrapper around an async function (a decorator without its own async def)
        # returns a coroutine: its result is what the tool returns, not the coroutine.
        if inspect.isawaitable(result):
            result = await result
        if inspect.isasyncgen(result):  # an async generator function: what it yields
            result = [item async for item in result]
        return result


def _collected(function: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """Call ``function``; a generator it returns is run to its end, in this same worker
    thread, and its items are the result: a generator object is no answer for a model."""
    result = function(*args, **kwargs)
    if inspect.isgenerator(result):
        return list(result)
    return result


@contextmanager
def tool_threads(concurrency: int) -> Iterator[None]:
    """Let sync tools started within the block use up to ``concurrency`` worker threads at once.

    Sync tools share anyio's default limit of 40 threads, so a run allowing more executor steps
    at once than that would queue their tools behind it. Within the block (a run whose
    ``concurrency`` is above 40), they get a limiter of their own with ``concurrency`` threads;
    at 40 or less they keep sharing the default one, as any other code on the loop does.
    """
    if concurrency <= DEFAULT_TOOL_THREADS:
        yield
        return
    token = _tool_threads.set(anyio.CapacityLimiter(concurrency))
    try:
        yield
    finally:
        _tool_threads.reset(token)


def _doc(function: Callable[..., Any]) -> str:
    """The docstring of the function a tool runs: through a functools.partial to its function,
    whose docstring inspect.getdoc would give as partial's own ("partial(func, *args...")."""
    while isinstance(function, partial):
        function = function.func
    return inspect.getdoc(function) or ""


def _tool_name(function: Callable[..., Any], name: str | None) -> str:
    """``name``, else the function's own name; either must be one model providers accept."""
    chosen = name if name is not None else getattr(function, "__name__", "")
    if TOOL_NAME.fullmatch(chosen):
        return chosen
    if name is None:
        raise ValueError(
            f"{function!r} has no name a model can call it by: give one with "
            "tool(function, name=...) of letters, digits, '_' and '-', at most 64"
        )
    raise ValueError(
        f"tool name {name!r} is not one model providers accept: use letters, digits, '_' and "
        "'-', at most 64"
    )


def _args_model(
    function: Callable[..., Any], name: str
) -> tuple[type[BaseModel], dict[str, str], tuple[str, ...]]:
    """The arguments' model; which parameter each of its fields is; the positional-only
    parameters, in order (a function cannot take those by keyword)."""
    # The signature's annotations, not the function's: a functools.partial has only those.
    signature = inspect.signature(function, eval_str=True)
    params = signature.parameters.values()
    fields: dict[str, Any] = {}
    names: dict[str, str] = {}
    for index, param in enumerate(params):
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"tool {name!r}: *args and **kwargs are not supported")
        annotation = Any if param.annotation is inspect.Parameter.empty else param.annotation
        default = ... if param.default is inspect.Parameter.empty else param.default
        field = param.name
        if field.startswith("_") or hasattr(BaseModel, field):
            # pydantic takes a leading "_" for a private attribute and a BaseModel name
            # (model_config, json...) for its own, so the parameter would vanish from the
            # schema: such a name becomes the alias of a field named otherwise.
            field = f"arg{index}"
            while field in signature.parameters:
                field += "_"
            annotation = Annotated[annotation, Field(alias=param.name)]
        fields[field] = (annotation, default)
        names[field] = param.name
    try:
        model: type[BaseModel] = create_model(
            f"{name}_args",
            __config__=ConfigDict(extra="forbid"),
            **fields,
        )
    except PydanticUserError:  # a type pydantic cannot validate
        _refuse_unschemable(function, name)
        raise
    positional = tuple(p.name for p in params if p.kind is p.POSITIONAL_ONLY)
    return model, names, positional


SUPPORTED_TYPES = (
    "str, int, float, bool, None, list, tuple, set, dict, Literal, an Enum, datetime, date, "
    "Decimal, UUID, a pydantic model, a dataclass or a TypedDict, and unions of them"
)


def _refuse_unschemable(function: Callable[..., Any], name: str) -> None:
    """Raise a :class:`TypeError` naming the first parameter of ``function`` whose type has no
    JSON schema (which a model would need to call the tool); return if none is found."""
    for param in inspect.signature(function, eval_str=True).parameters.values():
        if param.annotation is inspect.Parameter.empty:
            continue
        try:
            TypeAdapter(param.annotation).json_schema()
        except PydanticUserError:
            hint = param.annotation
            shown = hint.__qualname__ if isinstance(hint, type) else repr(hint)
            raise TypeError(
                f"tool {name!r}: parameter {param.name!r} is annotated {shown}, "
                f"a type a model cannot be told how to give; use {SUPPORTED_TYPES}"
            ) from None


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside this module: where ``@tool`` was used,
    whether bare, with options or called."""
    frame = inspect.currentframe()
    level = 1
    while frame is not None and frame.f_globals.get("__name__") == __name__:
        frame = frame.f_back
        level += 1
    return level - 1


@overload
def tool(
    function: Callable[..., Any],
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout_s: float = ...,
    read_only: bool | None = None,
    destructive: bool | None = None,
) -> FunctionTool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    timeout_s: float = ...,
    read_only: bool | None = None,
    destructive: bool | None = None,
) -> Callable[[Callable[..., Any]], FunctionTool]: ...


def tool(
    function: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout_s: float = DEFAULT_TOOL_TIMEOUT_S,
    read_only: bool | None = None,
    destructive: bool | None = None,
) -> FunctionTool | Callable[[Callable[..., Any]], FunctionTool]:
    """Make a :class:`Tool` from a function; use bare (``@tool``) or with options.

    ``read_only`` and ``destructive`` say what it does to the world (:class:`ToolHints`): plan
    review shows them, and the review policy ``destructive`` asks a person for a plan that may
    use a tool not marked ``read_only=True`` or ``destructive=False``.

    >>> @tool(timeout_s=5)
    ... async def fetch(url: str) -> str:
    ...     '''Fetch a page.'''
    ...     return url
    >>> fetch.timeout_s
    5
    """

    hints = ToolHints(read_only=read_only, destructive=destructive)

    def wrap(fn: Callable[..., Any]) -> FunctionTool:
        return FunctionTool(
            fn, name=name, description=description, timeout_s=timeout_s, hints=hints
        )

    return wrap(function) if function is not None else wrap


class Toolset(ABC):
    """Tools that live behind a connection, such as the tools of an MCP server.

    :meth:`open` connects and yields the tools, which work until the context exits. A run given
    a toolset in ``tools=`` opens it for the run's duration (so concurrent runs each get their
    own connection); open it yourself and pass the tools to share one connection between runs.
    """

    name: str = "toolset"

    @abstractmethod
    def open(self) -> AbstractAsyncContextManager[Sequence[Tool]]:
        """Connect; the context yields the tools and disconnects on exit."""


class Toolbox:
    """The tools of a run, by name. Node allowlists select from it."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        # specs() per allowlist: every leaf asks, and nodes of a plan share their allowlist.
        self._specs: dict[frozenset[str] | None, tuple[ToolSpec, ...]] = {}
        # Plans' arguments that passed their tool's check, by identity (the object is kept, so
        # that its id is not reused): the step's call then does not check them again.
        self._checked: dict[int, tuple[str, Mapping[str, Any]]] = {}
        for t in tools:
            self.add(t)

    def add(self, new: Tool) -> None:
        """Add a tool; names must be unique (else :class:`~hierplan.errors.DuplicateToolError`,
        bad input like any other the run refuses before it starts)."""
        if new.name in self._tools:
            raise DuplicateToolError(
                f"two tools are named {new.name!r}: rename one (an MCP server takes a "
                "tool_prefix for this)"
            )
        self._tools[new.name] = new
        self._specs.clear()

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def names(self) -> frozenset[str]:
        """Names of all tools."""
        return frozenset(self._tools)

    def get(self, name: str, allowed: frozenset[str] | None = None) -> Tool:
        """The tool called ``name``; raise if it is unknown or not in ``allowed``."""
        found = self._tools.get(name)
        if found is None:
            known = ", ".join(sorted(self._tools)) or "none"
            raise ToolNotAllowedError(f"unknown tool {name!r} (known tools: {known})")
        if allowed is not None and name not in allowed:
            raise ToolNotAllowedError(f"tool {name!r} is not allowed for this node")
        return found

    def check_planned(self, name: str, arguments: Mapping[str, Any]) -> None:
        """Validate a plan's ``arguments`` for the tool ``name`` (raising
        :class:`~hierplan.errors.ToolArgsError` as :meth:`Tool.validate` does), and remember
        that these very arguments passed (see :meth:`take_checked`)."""
        self.get(name).validate(arguments)
        self._checked[id(arguments)] = (name, arguments)

    def take_checked(self, name: str, arguments: Mapping[str, Any]) -> bool:
        """Whether :meth:`check_planned` passed these very ``arguments`` (the same object) for
        the tool ``name``; it answers yes once, for the step's first call (a later attempt
        checks again)."""
        found = self._checked.pop(id(arguments), None)
        return found is not None and found[0] == name and found[1] is arguments

    def specs(self, allowed: frozenset[str] | None = None) -> tuple[ToolSpec, ...]:
        """Tool specs for a model request, limited to ``allowed`` when given."""
        found = self._specs.get(allowed)
        if found is None:
            found = tuple(
                t.spec for t in self._tools.values() if allowed is None or t.name in allowed
            )
            if len(self._specs) < 1024:  # allowlists are few; never let the cache grow unbounded
                self._specs[allowed] = found
        return found


def result_text(result: Any, *, limit: int = 4000) -> str:
    """A tool result as text for a model, truncated to ``limit`` characters.

    Strings stay as they are; anything else becomes JSON: pydantic models, dataclasses, sets,
    dates and the like as their JSON form, what JSON has no form for as its ``str``. It never
    raises, whatever a tool returns.

    >>> result_text({(0, 1): "b", "n": {2, 1}})
    '{"0,1": "b", "n": [1, 2]}'
    """
    text = result if isinstance(result, str) else _json_text(result)
    return text if len(text) <= limit else text[:limit] + f"... [{len(text) - limit} more]"


def _json_text(result: Any) -> str:
    # Every step catches any Exception: a tool's value runs its own code here (a __str__ that
    # raises), and an int of more than 4300 digits has no decimal text at all.
    try:
        return _ENCODER.encode(result)
    except Exception:
        pass  # keys JSON cannot take (a tuple), or a value that contains itself
    try:
        return json.dumps(to_jsonable_python(result, fallback=str))
    except Exception:
        pass
    try:
        return repr(result)  # a reference cycle: the repr marks it, and still shows the rest
    except Exception as exc:
        return f"[a {type(result).__name__} with no text form: {exc}]"


def _jsonable(value: Any) -> Any:
    """The encoder's ``default``: a value JSON has no form for, in one it has."""
    return to_jsonable_python(value, fallback=str)


# json.dumps(result, default=_jsonable) with the encoder made once, not once a call: it keeps no
# state between calls, and a tool-only leaf encodes three texts (its arguments, its output twice).
_ENCODER = json.JSONEncoder(default=_jsonable)


ToolFunction = Callable[..., Any] | Callable[..., Awaitable[Any]]
__all__ = [
    "DEFAULT_TOOL_TIMEOUT_S",
    "FunctionTool",
    "Tool",
    "ToolError",
    "ToolFunction",
    "ToolHints",
    "Toolbox",
    "Toolset",
    "result_text",
    "tool",
]
