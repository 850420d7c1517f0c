"""Tools from MCP servers, through the official ``mcp`` SDK (install ``hierplan[mcp]``).

A server is a :class:`~hierplan.tools.base.Toolset`: pass it in ``tools=`` and the run
starts (stdio) or connects to (streamable HTTP) the server, lists its tools, and closes the
connection when the run ends; each run gets its own connection. To share one connection between
runs, open it yourself::

    server = MCPServerStdio("python", ["weather_server.py"])
    result = await hierplan.run(goal, tools=[server], model="openai:gpt-5-mini")

    async with server.open() as tools:  # one server process for many runs
        results = [await hierplan.run(g, tools=tools, model=...) for g in goals]

Each server tool becomes a :class:`MCPTool`: the server's name (with ``tool_prefix``), its
description and its JSON schema, which models see and which the plan gate and every call check
arguments against. Step allowlists (a step's ``tools``) apply to MCP tools like to any other.

Results: a tool's structured content is its value (a plain value that the server wrapped as
``{"result": value}``, as the Python SDK does, is the value itself), else its text.

Failures: a tool that reports an error (``isError``) fails its call with
:class:`~hierplan.errors.ToolError` and the server's message, not retried (the same call would
fail the same way) unless the server is made with ``retry_tool_errors=True``; an executor's
model sees the message. A server that exits or drops the connection fails the calls in flight
and every later call at once with :class:`~hierplan.errors.ToolServerGone`, which is not
retried: the step fails and its planner replans. A server that stops answering runs into the
tool timeout (``timeout_s``). None of these hangs the run. A stdio server that cannot be
started is reported with the last lines of its stderr.
"""

from __future__ import annotations

import os
import sys
import threading
from abc import abstractmethod
from collections import deque
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, TextIO

import anyio
import mcp_types
from anyio.abc import TaskStatus
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from jsonschema.protocols import Validator
from jsonschema.validators import validator_for
from mcp import Client, MCPError, StdioServerParameters, stdio_client
from mcp.client import Transport
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from referencing.exceptions import Unresolvable

from hierplan.errors import (
    MAX_LISTED_PROBLEMS,
    ToolArgsError,
    ToolError,
    ToolServerGone,
    UserInputError,
)
from hierplan.tools.base import DEFAULT_TOOL_TIMEOUT_S, Tool, ToolHints, Toolset

DEFAULT_CONNECT_TIMEOUT_S = 30.0
_MAX_LIST_PAGES = 100
STDERR_TAIL_LINES = 12
"""How many of a stdio server's last stderr lines the error of a server that fails quotes."""


class _Connection:
    """One open connection to a server; remembers when the server is gone.

    The SDK's transport runs in a task of its own (see :meth:`MCPServer.open`), so a transport
    that crashes ends that task only; the calls in flight are then cancelled and fail with
    :class:`ToolServerGone`.
    """

    def __init__(self, server: str, client: Client) -> None:
        self.server = server
        self.client = client
        self.gone: str | None = None
        self.closing = anyio.Event()
        self._calls: set[anyio.CancelScope] = set()

    def error(self) -> ToolServerGone:
        return ToolServerGone(
            f"MCP server {self.server!r} is gone ({self.gone}); its tools cannot be used "
            "for the rest of this run"
        )

    def mark_gone(self, why: str) -> ToolServerGone:
        if self.gone is None:
            self.gone = why
            for scope in self._calls:
                scope.cancel()
        return self.error()

    async def call(
        self, name: str, arguments: dict[str, Any], timeout_s: float
    ) -> mcp_types.CallToolResult:
        if self.gone is not None:
            raise self.error()
        with anyio.CancelScope() as scope:
            self._calls.add(scope)
            try:
                # The call's own deadline, not the session's (the connect timeout): a tool
                # may take longer than starting the server does.
                return await self.client.call_tool(name, arguments, read_timeout_seconds=timeout_s)
            except MCPError as exc:
                if exc.code == mcp_types.CONNECTION_CLOSED:
                    raise self.mark_gone("the connection closed") from exc
                raise ToolError(
                    f"MCP server {self.server!r} refused tool {name!r}: {exc.message}"
                ) from exc
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
                raise self.mark_gone(_reason(exc)) from exc
            finally:
                self._calls.discard(scope)
        # Only mark_gone cancels this scope: the transport died under the call.
        raise self.error()


class MCPTool(Tool):
    """One tool of an MCP server, called through the server's connection."""

    def __init__(
        self,
        connection: _Connection,
        spec: mcp_types.Tool,
        *,
        prefix: str = "",
        timeout_s: float = DEFAULT_TOOL_TIMEOUT_S,
        retry_tool_errors: bool = False,
    ) -> None:
        super().__init__(
            prefix + spec.name,
            spec.description or spec.title or spec.name,
            spec.input_schema,
            timeout_s=timeout_s,
            hints=_hints(spec.annotations),
            source=f"MCP server {connection.server}",
        )
        self.remote_name = spec.name
        self.server = connection.server
        self.retry_tool_errors = retry_tool_errors
        self._connection = connection
        self._wrapped = _wraps_plain_value(spec.output_schema)
        # The draft the schema names in "$schema" (draft-07's tuple "items" and "dependencies"
        # mean nothing to 2020-12), else 2020-12, the MCP specification's default.
        draft = validator_for(spec.input_schema, default=Draft202012Validator)
        try:
            draft.check_schema(spec.input_schema)
        except SchemaError:
            # A server with a broken schema: let the server judge the arguments.
            self._validator: Validator | None = None
        else:
            self._validator = draft(spec.input_schema)

    def validate(self, arguments: Mapping[str, Any]) -> Mapping[str, Any]:
        """Check ``arguments`` against the server's JSON schema; errors name each bad field."""
        if not isinstance(arguments, Mapping):
            raise ToolArgsError(
                f"tool {self.name!r} takes an object of arguments, got {type(arguments).__name__}"
            )
        if self._validator is not None:
            try:
                errors = sorted(self._validator.iter_errors(dict(arguments)), key=lambda e: e.path)
            except Unresolvable:
                # A "$ref" to nowhere passes check_schema and fails only here: the schema is
                # broken after all, so the server judges the arguments, as for any other.
                self._validator = None
                return arguments
            if errors:
                problems = "; ".join(
                    f"{'.'.join(str(p) for p in e.absolute_path) or 'arguments'}: {e.message}"
                    for e in errors[:MAX_LISTED_PROBLEMS]
                )
                more = len(errors) - MAX_LISTED_PROBLEMS
                if more > 0:  # said, as field_problems says it for a local tool
                    problems += f"; and {more} more"
                raise ToolArgsError(f"invalid arguments for tool {self.name!r}: {problems}")
        return arguments

    async def invoke(self, arguments: Mapping[str, Any]) -> Any:
        """Call the tool on the server: its structured content if it returns any (a plain value
        the server wrapped as ``{"result": value}`` unwrapped), else its text. A tool's own
        error fails with the server's message, retried only with ``retry_tool_errors``."""
        result = await self._connection.call(self.remote_name, dict(arguments), self.timeout_s)
        if result.is_error:
            text = _content_text(result.content)
            raise ToolError(
                f"MCP tool {self.name!r} failed: {text or 'no message'}",
                retryable=self.retry_tool_errors,
            )
        found = result.structured_content
        if found is None:
            return _content_text(result.content)
        if self._wrapped and isinstance(found, dict) and list(found) == ["result"]:
            return found["result"]
        return found


def _hints(annotations: mcp_types.ToolAnnotations | None) -> ToolHints:
    if annotations is None:
        return ToolHints()
    return ToolHints(
        read_only=annotations.read_only_hint,
        destructive=annotations.destructive_hint,
        idempotent=annotations.idempotent_hint,
        open_world=annotations.open_world_hint,
    )


def _wraps_plain_value(schema: Mapping[str, Any] | None) -> bool:
    """Whether a tool's output schema says it wraps a plain value as ``{"result": value}``: the
    Python SDK's ``<function>Output`` object of one required ``result``, or FastMCP's mark."""
    if not isinstance(schema, Mapping):
        return False
    if schema.get("x-fastmcp-wrap-result") is True:
        return True
    properties = schema.get("properties")
    return (
        schema.get("type") == "object"
        and isinstance(properties, Mapping)
        and list(properties) == ["result"]
        and schema.get("required") == ["result"]
        and str(schema.get("title", "")).endswith("Output")
    )


def _content_text(blocks: Sequence[mcp_types.ContentBlock]) -> str:
    parts: list[str] = []
    for block in blocks:
        if isinstance(block, mcp_types.TextContent):
            parts.append(block.text)
        elif isinstance(block, mcp_types.EmbeddedResource):
            res = block.resource
            text = getattr(res, "text", None)
            parts.append(text if isinstance(text, str) else f"[resource {res.uri}]")
        elif isinstance(block, mcp_types.ResourceLink):
            parts.append(f"[resource {block.uri}]")
        else:
            parts.append(f"[{block.type} {block.mime_type}]")
    return "\n".join(parts)


class MCPServer(Toolset):
    """What every MCP server takes: a name, a tool prefix, a tool filter and timeouts.

    ``include`` keeps only the named tools (server names, before the prefix). ``timeout_s`` is
    the deadline of one tool call, ``connect_timeout_s`` of starting up and listing the tools.
    ``retry_tool_errors``: a tool's own error (``isError``) is retried like a transient failure
    (by default it fails the step at once). ``shown`` is how messages name the server (by
    default :meth:`describe`: a configuration passes its text before ``${VAR}`` is read, so
    that no secret reaches a message).
    """

    def __init__(
        self,
        *,
        name: str,
        tool_prefix: str = "",
        include: Sequence[str] | None = None,
        timeout_s: float = DEFAULT_TOOL_TIMEOUT_S,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        retry_tool_errors: bool = False,
        shown: str | None = None,
    ) -> None:
        # `not > 0` also refuses NaN, which every comparison with a deadline gets wrong.
        if not (timeout_s > 0 and connect_timeout_s > 0):
            raise UserInputError(f"MCP server {name!r}: timeouts must be more than 0 seconds")
        self.name = name
        self.tool_prefix = tool_prefix
        self.include = None if include is None else tuple(include)
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.retry_tool_errors = retry_tool_errors
        self.shown = shown

    @abstractmethod
    def transport(self, errlog: TextIO | None = None) -> Transport:
        """A new (unopened) transport to the server (a stdio server's stderr to ``errlog``)."""

    @contextmanager
    def _stderr(self) -> Iterator[_StderrTail | None]:
        """What keeps the end of the server's stderr while it is open (a stdio server's)."""
        yield None

    @abstractmethod
    def describe(self) -> str:
        """How the server is reached, for error messages."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}: {self.shown or self.describe()}>"

    @asynccontextmanager
    async def open(self) -> AsyncIterator[Sequence[Tool]]:
        """Connect, list the tools, yield them as hierplan tools; disconnect on exit."""
        with self._stderr() as stderr:
            async with self._open(stderr) as tools:
                yield tools

    @asynccontextmanager
    async def _open(self, stderr: _StderrTail | None) -> AsyncIterator[Sequence[Tool]]:
        failure: str | None = None
        raised: BaseException | None = None
        try:
            async with anyio.create_task_group() as group:
                try:
                    connection, listed = await group.start(self._serve, stderr)
                except Exception as exc:  # any start-up failure is the user's to fix
                    failure = _reason(exc)
                    if stderr is not None:
                        failure += stderr.quoted()
                else:
                    failure = self._missing(listed)
                    try:
                        if failure is None:
                            yield self._tools(connection, listed)
                    except BaseException as exc:
                        raised = exc
                        raise
                    finally:
                        connection.mark_gone("the connection was closed by its user")
                        connection.closing.set()
        except BaseExceptionGroup as group_error:
            # What the block inside `async with server.open()` raised (a run's own error, say)
            # is the caller's, not the task group's: it goes on as it is, not in a group.
            if raised is None or list(group_error.exceptions) != [raised]:
                raise
        if raised is not None:
            raise raised
        if failure is not None:  # raised outside the task group, so not wrapped in a group
            raise UserInputError(
                f"cannot use MCP server {self.name!r} ({self.shown or self.describe()}): {failure}"
            )

    def _missing(self, listed: Sequence[mcp_types.Tool]) -> str | None:
        names = {spec.name for spec in listed}
        missing = sorted(set(self.include or ()) - names)
        if not missing:
            return None
        return (
            f"it has no tool {', '.join(map(repr, missing))} "
            f"(its tools: {', '.join(sorted(names)) or 'none'})"
        )

    def _tools(self, connection: _Connection, listed: Sequence[mcp_types.Tool]) -> list[Tool]:
        wanted = None if self.include is None else set(self.include)
        return [
            MCPTool(
                connection,
                spec,
                prefix=self.tool_prefix,
                timeout_s=self.timeout_s,
                retry_tool_errors=self.retry_tool_errors,
            )
            for spec in listed
            if wanted is None or spec.name in wanted
        ]

    async def _serve(
        self,
        stderr: _StderrTail | None,
        *,
        task_status: TaskStatus[tuple[_Connection, list[mcp_types.Tool]]],
    ) -> None:
        """Hold the connection in this task, so that a transport crash ends only this task."""
        connection: _Connection | None = None
        transport = self.transport(None if stderr is None else stderr.writer)
        try:
            async with Client(transport, read_timeout_seconds=self.connect_timeout_s) as c:
                if stderr is not None:
                    stderr.started()  # the server holds its own end of the pipe now
                listed = await _list_tools(c, self.connect_timeout_s)
                connection = _Connection(self.name, c)
                task_status.started((connection, listed))
                await connection.closing.wait()
        except Exception as exc:
            if connection is None:
                raise
            connection.mark_gone(_reason(exc))


async def _list_tools(client: Client, timeout_s: float) -> list[mcp_types.Tool]:
    found: list[mcp_types.Tool] = []
    cursor: str | None = None
    with anyio.fail_after(timeout_s):
        for _ in range(_MAX_LIST_PAGES):
            page = await client.list_tools(cursor=cursor)
            found.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                break
    return found


def _reason(exc: BaseException) -> str:
    """The innermost useful message of an exception (task groups wrap them in groups)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, TimeoutError):
        return "it did not answer in time"
    if isinstance(exc, MCPError):
        if exc.code == mcp_types.CONNECTION_CLOSED:
            return "the server closed the connection (is it an MCP server? its stderr says more)"
        return exc.message
    text = str(exc) or type(exc).__name__
    return text if isinstance(exc, OSError) else f"{type(exc).__name__}: {text}"


class MCPServerStdio(MCPServer):
    """An MCP server started as a subprocess, spoken to over its stdin and stdout.

    ``name`` defaults to the script's name. ``env`` is added to the few variables the SDK passes
    on (``PATH``, ``HOME``...). The server's stderr goes to ``errlog`` (this process's stderr by
    default) line by line; its last lines are quoted when the server fails to start. Every
    :meth:`open` starts a new process.

    >>> server = MCPServerStdio("python", ["weather_server.py"], name="weather")
    """

    def __init__(
        self,
        command: str,
        args: Sequence[str] = (),
        *,
        name: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        errlog: TextIO | None = None,
        **options: Any,
    ) -> None:
        if not command.strip():
            raise UserInputError("an MCP stdio server needs a command, e.g. 'python'")
        scripts = [a for a in args if not a.startswith("-")]
        default = Path(scripts[0]).stem if scripts else Path(command).name
        super().__init__(name=name or default, **options)
        self.command = command
        self.args = tuple(args)
        self.env = None if env is None else dict(env)
        self.cwd = cwd
        self.errlog = errlog

    def transport(self, errlog: TextIO | None = None) -> Transport:
        """The SDK's stdio transport: starts the server process when entered."""
        params = StdioServerParameters(
            command=self.command, args=list(self.args), env=self.env, cwd=self.cwd
        )
        return stdio_client(params, errlog=errlog or self.errlog or sys.stderr)

    @contextmanager
    def _stderr(self) -> Iterator[_StderrTail | None]:
        tail = _StderrTail(self.errlog)
        try:
            yield tail
        finally:
            tail.started()  # the process is gone or holds its own end: the pump ends with it

    def describe(self) -> str:
        """The command line."""
        return " ".join([self.command, *self.args])


class MCPServerStreamableHTTP(MCPServer):
    """An MCP server reached over streamable HTTP at ``url``, with ``headers`` sent on every
    request (an ``Authorization`` header, say).

    >>> server = MCPServerStreamableHTTP("http://127.0.0.1:8000/mcp", name="search")
    """

    def __init__(
        self,
        url: str,
        *,
        name: str | None = None,
        headers: Mapping[str, str] | None = None,
        **options: Any,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise UserInputError(f"MCP server URL {url!r} must start with http:// or https://")
        super().__init__(name=name or url, **options)
        self.url = url
        self.headers = dict(headers or {})

    def transport(self, errlog: TextIO | None = None) -> Transport:
        """The SDK's streamable HTTP transport (with the headers, on a client of its own)."""
        return _http_transport(self.url, self.headers)

    def describe(self) -> str:
        """The URL."""
        return self.url


@asynccontextmanager
async def _http_transport(url: str, headers: Mapping[str, str]) -> AsyncIterator[Any]:
    if not headers:
        async with streamable_http_client(url) as streams:
            yield streams
        return
    # The SDK's own client settings (its timeouts), with the headers; closed with the transport.
    async with (
        create_mcp_http_client(headers=dict(headers)) as client,
        streamable_http_client(url, http_client=client) as streams,
    ):
        yield streams


class _StderrTail:
    """A stdio server's stderr, read from a pipe by a thread of its own: each line passed on to
    ``dest`` (this process's ``sys.stderr`` at the time when ``None``, so that a live display
    that redirects it prints the line above itself) and the last lines kept, to quote when the
    server fails to start."""

    def __init__(self, dest: TextIO | None) -> None:
        read_fd, write_fd = os.pipe()
        self.writer = os.fdopen(write_fd, "w")
        self._dest = dest
        self._lines: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        self._thread = threading.Thread(
            target=self._pump, args=(os.fdopen(read_fd, "rb"),), daemon=True, name="mcp-stderr"
        )
        self._thread.start()

    def _pump(self, reader: Any) -> None:
        with reader:
            for raw in iter(reader.readline, b""):
                text = raw.decode(errors="replace")
                self._lines.append(text.rstrip())
                dest = self._dest or sys.stderr
                try:
                    dest.write(text)
                    dest.flush()
                except (OSError, ValueError):
                    pass  # a destination closed meanwhile: the tail is still kept

    def started(self) -> None:
        """Close this process's end of the pipe (the server holds its own, or has exited): the
        pump then ends when the server does."""
        if not self.writer.closed:
            self.writer.close()

    def quoted(self, wait_s: float = 2.0) -> str:
        """``; its stderr ends with:`` and the last lines, once the server is gone (``""`` when
        it wrote nothing)."""
        self.started()
        self._thread.join(wait_s)
        lines = [line for line in list(self._lines) if line.strip()]
        if not lines:
            return ""
        return "; its stderr ends with:\n    " + "\n    ".join(lines)


__all__ = ["MCPServer", "MCPServerStdio", "MCPServerStreamableHTTP", "MCPTool"]
