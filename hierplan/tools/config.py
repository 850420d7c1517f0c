"""Toolsets as configuration: the ``tools`` entries of a goal file, a batch line or a command
line, as one typed value (:class:`ToolsetSpec`) that a :class:`~hierplan.RunSpec` holds.

.. code-block:: yaml

    tools:
      - mcp: {command: npx, args: ["-y", "@modelcontextprotocol/server-filesystem", "./reports"]}
      - mcp: {url: "http://127.0.0.1:8931/mcp", headers: {Authorization: "Bearer ${TOKEN}"}}
      - python: mypackage.tools:toolset        # a Toolset, a list of tools, or one tool

An entry is kept as it was written: ``${VAR}`` is read from the environment only when the
toolset is opened (:meth:`ToolsetSpec.toolset`), so what a run, a checkpoint or a batch journal
saves of it never holds the value. :func:`toolset_problems` checks entries before anything runs:
a variable that is not set, a command that is not found, a Python path that does not import or
is not a toolset.
"""

from __future__ import annotations

import importlib
import os
import re
import shlex
import shutil
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TextIO

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from hierplan.errors import UserInputError
from hierplan.files import DataTextError, parse_data_text
from hierplan.redact import redact
from hierplan.tools.base import DEFAULT_TOOL_TIMEOUT_S, Tool, Toolset

VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
"""``${NAME}``: a value read from the environment when the toolset opens."""
KINDS = ("mcp", "python")
ENTRY_HELP = (
    "an entry is mcp: {command: ..., args: [...]}, mcp: {url: ..., headers: {...}} or "
    "python: module:attribute"
)
# A value shorter than this is not looked for in messages to hide it: "1" would be everywhere.
_SHORTEST_HIDDEN = 4
Environ = Mapping[str, str]


class MCPConfig(BaseModel):
    """An MCP server as configuration: a ``command`` (with ``args``, ``env``, ``cwd``) started
    over stdio, or a streamable-HTTP ``url`` (with ``headers``); and what every server takes
    (see :class:`~hierplan.MCPServer`): ``name``, ``tool_prefix``, ``include``, ``timeout_s``,
    ``connect_timeout_s``, ``retry_tool_errors``. ``shared``: in a batch, goals (of one worker)
    share one server instead of starting one each."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    command: str | None = Field(default=None, min_length=1)
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] | None = None
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] | None = None
    name: str | None = Field(default=None, min_length=1)
    tool_prefix: str = ""
    include: list[str] | None = None
    timeout_s: float = Field(default=DEFAULT_TOOL_TIMEOUT_S, gt=0, allow_inf_nan=False)
    connect_timeout_s: float = Field(default=30.0, gt=0, allow_inf_nan=False)
    retry_tool_errors: bool = False
    shared: bool = False

    @model_validator(mode="after")
    def _one_transport(self) -> MCPConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError("give a 'command' (a server over stdio) or a 'url', not both")
        if self.url is not None and (self.args or self.env is not None or self.cwd is not None):
            raise ValueError("'args', 'env' and 'cwd' go with a 'command', not a 'url'")
        if self.command is not None and self.headers is not None:
            raise ValueError("'headers' go with a 'url', not a 'command'")
        return self

    def texts(self) -> list[str]:
        """Every text of the entry where a ``${VAR}`` may stand."""
        found = [self.command or "", *self.args, self.cwd or "", self.url or ""]
        return found + list((self.env or {}).values()) + list((self.headers or {}).values())


class ToolsetSpec(BaseModel):
    """One ``tools`` entry: ``mcp`` (an :class:`MCPConfig`) or ``python`` (``module:attribute``
    naming a :class:`~hierplan.Toolset`, a list of tools or toolsets, or one tool). ``where``
    says where it was written (``goal file g.yaml, line 4``, ``--mcp``) for messages; it is not
    part of the entry's value and is not saved.

    >>> ToolsetSpec.model_validate({"python": "mypackage.tools:toolset"}).label()
    'python mypackage.tools:toolset'
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    mcp: MCPConfig | None = None
    python: str | None = None
    where: str | None = Field(default=None, exclude=True, repr=False)

    @model_validator(mode="before")
    @classmethod
    def _one_kind(cls, data: Any) -> Any:
        if isinstance(data, ToolsetSpec) or not isinstance(data, Mapping):
            if not isinstance(data, ToolsetSpec):
                raise ValueError(f"not a mapping ({ENTRY_HELP})")
            return data
        kinds = [key for key in data if key != "where"]
        unknown = [key for key in kinds if key not in KINDS]
        if unknown:
            raise ValueError(f"unknown kind {unknown[0]!r}: {ENTRY_HELP}")
        if len(kinds) != 1:
            raise ValueError(f"give one kind per entry ({ENTRY_HELP})")
        python = data.get("python")
        if "python" in data and not (isinstance(python, str) and _PYTHON_PATH.fullmatch(python)):
            raise ValueError(f"python: {python!r} is not module:attribute (e.g. mytools:toolset)")
        return data

    def saved(self) -> dict[str, Any]:
        """The entry as a goal file writes it (what it leaves at its defaults left out), as
        checkpoints, batch journals and Celery messages keep it: ``${VAR}`` unread."""
        return self.model_dump(mode="json", exclude_defaults=True)

    def label(self) -> str:
        """The entry in a few words, as written (``${VAR}`` unread), as messages show it:
        credentials written into it (a URL's password, a key among a command's arguments)
        taken out (:func:`hierplan.redact.redact`).

        >>> ToolsetSpec.model_validate({"mcp": {"url": "https://bob:hunter22@h/mcp"}}).label()
        'mcp https://REDACTED@h/mcp'
        """
        if self.python is not None:
            return f"python {self.python}"
        assert self.mcp is not None
        if self.mcp.url is not None:
            return redact(f"mcp {self.mcp.url}")
        return redact("mcp " + shlex.join([self.mcp.command or "", *self.mcp.args]))

    @property
    def shared(self) -> bool:
        """Whether goals of a batch share the entry's server."""
        return self.mcp is not None and self.mcp.shared

    def variables(self) -> list[str]:
        """The ``${VAR}`` names the entry reads, in order, once each."""
        texts = [] if self.mcp is None else self.mcp.texts()
        return list(dict.fromkeys(name for text in texts for name in VARIABLE.findall(text)))

    def problems(self, environ: Environ, *, local: bool = True) -> list[str]:
        """What would keep the entry from opening, found without starting anything:
        ``${VAR}`` not set in ``environ``, a command not found on its ``PATH``, a Python path
        that does not import or is not a toolset. ``local=False`` checks the entry's form only
        (for entries that open on other machines, with their environment and files)."""
        if not local:
            return []
        if self.python is not None:
            try:
                resolve_python(self.python)
            except UserInputError as exc:
                return [str(exc)]
            return []
        missing = [f"${{{name}}} is not set" for name in self.variables() if name not in environ]
        if missing:
            return missing
        assert self.mcp is not None
        if self.mcp.command is not None:
            command = expand(self.mcp.command, environ)
            if shutil.which(command, path=environ.get("PATH", os.defpath)) is None:
                return [f"command {command!r} is not found (is it installed, and on PATH?)"]
        elif not expand(self.mcp.url or "", environ).startswith(("http://", "https://")):
            return [f"url {self.mcp.url!r} must start with http:// or https://"]
        return []

    def toolset(self, environ: Environ, errlog: TextIO | None = None) -> list[Tool | Toolset]:
        """What the entry names, ready to open: an MCP server (``${VAR}`` read from
        ``environ`` now; a stdio server's stderr to ``errlog``, this process's by default), or
        the Python object's tools and toolsets."""
        if self.python is not None:
            return resolve_python(self.python)
        assert self.mcp is not None
        from hierplan.tools.mcp import MCPServerStdio, MCPServerStreamableHTTP

        config = self.mcp
        options: dict[str, Any] = {
            "tool_prefix": config.tool_prefix,
            "include": config.include,
            "timeout_s": config.timeout_s,
            "connect_timeout_s": config.connect_timeout_s,
            "retry_tool_errors": config.retry_tool_errors,
            "shown": self.label().removeprefix("mcp "),
        }
        if config.name is not None:
            options["name"] = config.name
        if config.url is not None:
            headers = {k: expand(v, environ) for k, v in (config.headers or {}).items()}
            return [
                MCPServerStreamableHTTP(expand(config.url, environ), headers=headers, **options)
            ]
        env = None if config.env is None else {k: expand(v, environ) for k, v in config.env.items()}
        return [
            MCPServerStdio(
                expand(config.command or "", environ),
                [expand(arg, environ) for arg in config.args],
                env=env,
                cwd=None if config.cwd is None else expand(config.cwd, environ),
                errlog=errlog,
                **options,
            )
        ]

    def hidden(self, text: str, environ: Environ) -> str:
        """``text`` (an error message) with the values of the entry's variables put back as
        ``${VAR}``: a server's error may quote the URL or the command it was given."""
        for name in self.variables():
            value = environ.get(name, "")
            if len(value) >= _SHORTEST_HIDDEN:
                text = text.replace(value, f"${{{name}}}")
        return text

    def named(self, index: int) -> str:
        """``tools entry N (label)``, with where it was written when known."""
        where = f"{self.where}: " if self.where else ""
        return f"{where}tools entry {index} ({self.label()})"


_PYTHON_PATH = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


def expand(text: str, environ: Environ) -> str:
    """``text`` with each ``${VAR}`` read from ``environ`` (a missing one is a
    :class:`UserInputError`: :func:`toolset_problems` finds them first)."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in environ:
            raise UserInputError(f"${{{name}}} is not set")
        return environ[name]

    return VARIABLE.sub(value, text)


def resolve_python(path: str) -> list[Tool | Toolset]:
    """The tools and toolsets ``module:attribute`` names; a :class:`UserInputError` when it
    does not import or is not a tool, a toolset, or a list of them."""
    module_name, _, attribute = path.partition(":")
    try:
        found: Any = importlib.import_module(module_name)
    except Exception as exc:  # a module's own import error is the user's to fix, named
        raise UserInputError(
            f"python {path}: cannot import {module_name} ({type(exc).__name__}: {exc})"
        ) from None
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise UserInputError(f"python {path}: {module_name} has no attribute {attribute!r}")
        found = getattr(found, part)
    items = list(found) if isinstance(found, list | tuple) else [found]
    wrong = [item for item in items if not isinstance(item, Tool | Toolset)]
    if wrong or not items:
        what = type(wrong[0]).__name__ if wrong else "an empty list"
        raise UserInputError(
            f"python {path} is not a toolset ({what}): name a hierplan.Toolset (an MCP "
            "server), a tool (@hierplan.tool), or a list of them"
        )
    return items


def toolset_entries(
    data: Any, *, where: str | None = None, lines: Sequence[int] | None = None
) -> tuple[ToolsetSpec, ...]:
    """``data`` (a list of entries as a goal file writes them) as checked entries, each noted
    with ``where`` it was written (and its line, when ``lines`` gives each entry's); a
    :class:`UserInputError` names every bad entry."""
    if not isinstance(data, list | tuple):
        raise UserInputError(f"{where + ': ' if where else ''}tools must be a list ({ENTRY_HELP})")
    entries: list[ToolsetSpec] = []
    problems: list[str] = []
    for index, item in enumerate(data, 1):
        at = where
        if lines is not None and index <= len(lines):
            at = f"{where}, line {lines[index - 1]}" if where else f"line {lines[index - 1]}"
        try:
            entry = item if isinstance(item, ToolsetSpec) else ToolsetSpec.model_validate(item)
        except ValidationError as exc:
            problems.append(f"{at + ': ' if at else ''}tools entry {index}: {_first(exc)}")
        else:
            entries.append(entry.model_copy(update={"where": at}) if at else entry)
    if problems:
        raise UserInputError("; ".join(problems))
    return tuple(entries)


def _first(exc: ValidationError) -> str:
    error = exc.errors()[0]
    place = ".".join(str(p) for p in error["loc"])
    message = str(error["msg"]).removeprefix("Value error, ")
    return f"{place}: {message}" if place else message


def toolset_problems(
    entries: Sequence[ToolsetSpec], environ: Environ, *, local: bool = True
) -> list[str]:
    """Every problem of ``entries`` found without starting anything (see
    :meth:`ToolsetSpec.problems`), each naming its entry."""
    return [
        f"{entry.named(index)}: {problem}"
        for index, entry in enumerate(entries, 1)
        for problem in entry.problems(environ, local=local)
    ]


def check_toolsets(entries: Sequence[ToolsetSpec], environ: Environ) -> None:
    """Raise a :class:`UserInputError` listing :func:`toolset_problems`, if there are any."""
    problems = toolset_problems(entries, environ)
    if problems:
        raise UserInputError("; ".join(problems))


def entries_from_flags(tools: Iterable[str], mcp: Iterable[str]) -> tuple[ToolsetSpec, ...]:
    """The entries of ``--tools module:attribute`` and ``--mcp`` flags. An ``--mcp`` value is a
    URL (``http://...``), a command line (``npx -y @modelcontextprotocol/server-everything``),
    or a goal file's ``mcp`` mapping as YAML (``{url: ..., headers: {...}, shared: true}``)."""
    found: list[ToolsetSpec] = []
    for path in tools:
        found += toolset_entries([{"python": path.strip()}], where=f"--tools {path}")
    for text in mcp:
        stripped = text.strip()
        where = redact(f"--mcp {shlex.quote(text)}")  # for messages: no credential in them
        if stripped.startswith("{"):
            try:
                config: Any = parse_data_text(stripped)
            except DataTextError as exc:
                raise UserInputError(f"{where}: {exc}") from None
        elif stripped.startswith(("http://", "https://")):
            config = {"url": stripped}
        else:
            try:
                words = shlex.split(stripped)
            except ValueError as exc:
                raise UserInputError(f"{where}: {exc}") from None
            if not words:
                raise UserInputError(f"{where}: give a command, a URL, or a mapping")
            config = {"command": words[0], "args": words[1:]}
        found += toolset_entries([{"mcp": config}], where=where)
    return tuple(found)


__all__ = [
    "MCPConfig",
    "ToolsetSpec",
    "check_toolsets",
    "entries_from_flags",
    "expand",
    "resolve_python",
    "toolset_entries",
    "toolset_problems",
]
