"""Files: reading what a user gives and writing what a run leaves.

- :func:`open_regular_file` opens a file to read, refusing at once what is not a regular file
  (a FIFO would be waited on forever, a device read without end); :func:`read_text_file` reads
  a plan or goal file so, refusing more than :data:`MAX_TEXT_FILE_BYTES`;
  :func:`parse_data_text` and :func:`parse_yaml_or_json` read YAML and JSON text that no one
  vouches for, strict where PyYAML and ``json`` are lenient (a key given twice, aliases that
  expand without bound, YAML of more than :data:`MAX_YAML_VALUES` values, values that cannot be
  converted are refused with their line; unquoted dates stay text, as in JSON), with one line
  that says what is wrong.
- :func:`write_atomic` writes a file whole or not at all; :func:`make_directory` and
  :func:`new_directory` make directories, saying why one cannot be made.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import sys
import tempfile
from pathlib import Path
from typing import Any, BinaryIO, TypeAlias

import yaml

from hierplan.errors import UserInputError

# The most values a YAML file's aliases may expand to. An alias costs one line but stands for
# everything its anchor holds, so nine lines of nested aliases make a billion strings (that no
# one could print, send or run); a plan anywhere near this size is no plan a person wrote.
MAX_ALIASED_VALUES = 100_000


class DataTextError(ValueError):
    """Why a YAML or JSON text cannot be read, in one line that follows the text's name
    ("plan file p.yaml" + " is nested too deeply to read")."""


class _Strict(yaml.constructor.SafeConstructor):
    """A constructor that refuses a key given twice in one mapping (PyYAML keeps the last
    silently, so a second ``steps:`` would drop the first list unseen) and says which value it
    cannot convert, and where."""

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        # PyYAML's constructors raise what Python raises on a value they cannot convert:
        # ValueError for "2020-02-30" or !!int "abc", AttributeError for !!timestamp "x",
        # IndexError for an empty !!int. Each is a bad value at a line of the file, not a
        # number with too many digits nor a traceback.
        try:
            return super().construct_object(node, deep=deep)
        except (DataTextError, RecursionError):
            raise
        except (ValueError, TypeError, AttributeError, ArithmeticError, LookupError):
            if not isinstance(node, yaml.ScalarNode):
                raise
            line = node.start_mark.line + 1
            if (
                node.tag == "tag:yaml.org,2002:int"
                and len(node.value) > sys.get_int_max_str_digits()
            ):
                raise DataTextError(f"holds a number with too many digits (line {line})") from None
            shown = node.value if len(node.value) <= 40 else node.value[:40] + "..."
            kind = node.tag.rsplit(":", 1)[-1]
            raise DataTextError(
                f"is not valid YAML/JSON: {shown!r} is not a valid {kind} (line {line})"
            ) from None

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # '<<' merges another mapping in; its keys may be overridden
                key = self.construct_object(key_node, deep=True)
                try:
                    repeated = key in seen
                    seen.add(key)
                except TypeError:
                    continue  # an unhashable key: the constructor reports it
                if repeated:
                    raise DataTextError(
                        f"is not valid YAML/JSON: key {key!r} appears twice in one mapping "
                        f"(line {key_node.start_mark.line + 1}): keep one"
                    )
        return super().construct_mapping(node, deep=deep)


# Plans and goal files hold JSON-shaped data, so plain scalars are read as JSON and YAML 1.2
# (its core schema) read them, not as PyYAML's YAML 1.1 does: a date written unquoted
# ("when: 2024-05-01") is the text written, not a datetime that a tool's string argument then
# refuses; "seed: 010" is 10, not octal 8; "1:30" and "1_000" are text, not 90 and 1000;
# "no" and "off" are text, not false; "1e3" is a number, where YAML 1.1 reads text. Explicit
# tags (!!timestamp, !!bool yes) still convert as they say.
class _Resolver(yaml.resolver.Resolver):
    """PyYAML's resolver with the plain scalars of JSON and YAML 1.2 (set up below)."""


_YAML_1_1 = frozenset(f"tag:yaml.org,2002:{t}" for t in ("bool", "int", "float", "timestamp"))
_Resolver.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in _YAML_1_1]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
# In this order: a scalar takes the first resolver that matches ("10" is an int, not a float).
_Resolver.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
_Resolver.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"),
    list("-+0123456789"),
)
_Resolver.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+.0123456789"),
)


def _yaml_1_2_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    """An int as YAML 1.2 reads it: decimal (leading zeros too), ``0o`` octal, ``0x`` hex."""
    value = str(loader.construct_scalar(node))
    if value.startswith(("0o", "0x")):
        return int(value[2:], 8 if value[1] == "o" else 16)
    return int(value, 10)


_Strict.add_constructor("tag:yaml.org,2002:int", _yaml_1_2_int)

# The most values (scalars, lists, mappings, aliases) a YAML text may hold. PyYAML keeps a node
# of some 400 bytes for each while it reads (and the pure-Python reader takes 20 µs each): 16
# MiB of "[a,a,a,...]" made 8 million of them, gigabytes. JSON, read by a faster reader into
# plain values, has no such limit.
MAX_YAML_VALUES = 1_000_000
_VALUE_EVENTS = (yaml.ScalarEvent, yaml.AliasEvent, yaml.CollectionStartEvent)


class _StrictLoader(yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser,
                    yaml.composer.Composer, _Strict, _Resolver):  # fmt: skip
    """PyYAML's own reader, in Python (where PyYAML has no libyaml, and to say where a text is
    not YAML): strict, counting the values and noting aliases as it composes."""

    def __init__(self, text: str) -> None:
        yaml.reader.Reader.__init__(self, text)
        yaml.scanner.Scanner.__init__(self)
        yaml.parser.Parser.__init__(self)
        yaml.composer.Composer.__init__(self)
        _Strict.__init__(self)
        _Resolver.__init__(self)
        self.values = 0
        self.saw_alias = False

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self.saw_alias = True
        self.values += 1
        if self.values > MAX_YAML_VALUES:
            raise DataTextError(_too_many_values())
        return super().compose_node(parent, index)


def _too_many_values() -> str:
    return (
        f"holds more than {MAX_YAML_VALUES:,} values, more than a plan or a goal needs: write "
        "it as JSON (a .json file), which is read faster and in less memory"
    )


def _load_yaml_python(text: str) -> tuple[Any, bool]:
    """The data of ``text`` and whether it has aliases, read by PyYAML's own reader."""
    loader = _StrictLoader(text)
    try:
        return loader.get_single_data(), loader.saw_alias
    finally:
        loader.dispose()


_load_yaml = _load_yaml_python
if yaml.__with_libyaml__:
    from yaml._yaml import CParser

    class _CStrictLoader(CParser, _Strict, _Resolver):
        """libyaml's reader (some five times faster than PyYAML's), constructed as strictly."""

        def __init__(self, text: str) -> None:
            CParser.__init__(self, text)
            _Strict.__init__(self)
            _Resolver.__init__(self)

    def _load_yaml_libyaml(text: str) -> tuple[Any, bool]:
        """The data of ``text`` and whether it has aliases, read by libyaml: its events are
        counted first (refused past :data:`MAX_YAML_VALUES` before any node is made), then
        the nodes composed and constructed."""
        parser = CParser(text)
        values, aliases = 0, False
        try:
            while (event := parser.get_event()) is not None:
                if isinstance(event, _VALUE_EVENTS):
                    values += 1
                    aliases = aliases or isinstance(event, yaml.AliasEvent)
                    if values > MAX_YAML_VALUES:
                        raise DataTextError(_too_many_values())
        finally:
            parser.dispose()
        loader = _CStrictLoader(text)
        try:
            return loader.get_single_data(), aliases
        finally:
            loader.dispose()

    def _load_yaml_either(text: str) -> tuple[Any, bool]:
        """libyaml's reading of ``text``; where libyaml finds it is not YAML, PyYAML's reading
        (which says where, with the problem itself, more often), as before libyaml read."""
        try:
            return _load_yaml_libyaml(text)
        except yaml.YAMLError as exc:
            if "maximum nesting depth" in str(exc):
                raise  # Python's recursion limit, far slower, would only say the same
            try:
                return _load_yaml_python(text)
            except (OverflowError, ValueError):
                # PyYAML turns a "\U" escape past any character into chr() of it, which
                # raises: libyaml's own message says what is wrong.
                raise exc from None

    _load_yaml = _load_yaml_either


def _json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DataTextError(
                f"is not valid YAML/JSON: key {key!r} appears twice in one object: keep one"
            )
        out[key] = value
    return out


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML error in one line: what is wrong and where (PyYAML's first line is often only
    the context, e.g. "while parsing a flow sequence", without the problem or the line)."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem:
        mark = exc.problem_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        return f"{exc.problem}{where}"
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _check_aliased_size(data: Any) -> None:
    """Refuse data whose aliases refer to themselves or expand past :data:`MAX_ALIASED_VALUES`."""
    count = 0
    on_path: set[int] = set()

    def walk(value: Any) -> None:
        nonlocal count
        count += 1
        if count > MAX_ALIASED_VALUES:
            raise DataTextError(
                "is not valid YAML/JSON: its aliases expand to more than "
                f"{MAX_ALIASED_VALUES:,} values: write the values out, or use fewer aliases"
            )
        if isinstance(value, dict | list):
            if id(value) in on_path:
                raise DataTextError(
                    "is not valid YAML/JSON: an alias refers to a value that contains it"
                )
            on_path.add(id(value))
            for item in value.values() if isinstance(value, dict) else value:
                walk(item)
            on_path.discard(id(value))

    walk(data)


def parse_data_text(text: str, *, json_syntax: bool = False) -> Any:
    """The data in ``text`` (JSON if ``json_syntax``, else YAML, a superset of JSON), or a
    :class:`DataTextError` saying in one line what is wrong: bad syntax, a key given twice,
    nesting too deep, a number too long, or aliases that expand without bound."""
    try:
        if json_syntax:
            return json.loads(text, object_pairs_hook=_json_object)
        data, aliases = _load_yaml(text)
        if aliases:
            _check_aliased_size(data)
        return data
    except DataTextError:
        raise
    except json.JSONDecodeError as exc:
        raise DataTextError(
            f"is not valid YAML/JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        ) from None
    except yaml.YAMLError as exc:
        if "maximum nesting depth" in str(exc):  # libyaml's limit, as Python's below
            raise DataTextError("is nested too deeply to read") from None
        raise DataTextError(f"is not valid YAML/JSON: {_yaml_problem(exc)}") from None
    except RecursionError:
        raise DataTextError("is nested too deeply to read") from None
    except ValueError:  # Python's limit on the digits of an integer it converts
        raise DataTextError("holds a number with too many digits") from None


def _read_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# Read once, at import: os.umask can only be read by setting it, which is not thread-safe later.
_UMASK = _read_umask()


def make_directory(path: Path, what: str) -> None:
    """Create the directory ``path`` (and its parents), or raise :class:`UserInputError`
    saying why it cannot be (``what``: what the directory is for, in the message)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        # "File exists" would mislead when a file stands where a directory should be.
        blocker = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)
        reason = f"{blocker} is a file, not a directory" if blocker else exc.strerror or str(exc)
        raise UserInputError(f"cannot create {what} {path}: {reason}") from None


def new_directory(parent: Path, stem: str, what: str) -> Path:
    """Create and return a directory of ``parent`` named ``stem`` that did not exist, or
    ``stem-2``, ``stem-3``, ... when it did: two commands started in the same second each get
    their own default output directory (``runs/<time>``) instead of one refusing the other.
    Making the directory is what claims the name, so two processes cannot both take it."""
    make_directory(parent, what)
    path, n = parent / stem, 1
    while True:
        try:
            path.mkdir()
            return path
        except FileExistsError:
            n += 1
            path = parent / f"{stem}-{n}"
        except OSError as exc:
            raise UserInputError(f"cannot create {what} {path}: {exc.strerror or exc}") from None


def write_atomic(path: Path, text: str, *, durable: bool = True) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename.

    The file gets the mode a plain ``open(path, "w")`` would give it (an existing file's mode,
    else 0666 less the umask), not the owner-only mode of the temporary file. Its data reaches
    the disk before the rename: otherwise a power cut soon after could leave the renamed file
    empty (the rename is journaled before the data is written), and a reader would find
    neither the old text nor the new. With ``durable=False`` there is no such wait (no
    ``fsync``), for a file whose loss in a power cut costs only a figure: a reader still finds
    the old text or the new one whenever the system stays up.
    """
    try:
        mode = path.stat().st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o666 & ~_UMASK
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# The largest plan or goal file read: far above any plan a run can hold (MAX_GOAL_CHARS per
# text), and a bound on what a wrong file given by mistake can make us read.
MAX_TEXT_FILE_BYTES = 16 * 1024 * 1024


def open_regular_file(path: Path, what: str) -> BinaryIO:
    """``path`` opened for reading in binary, or a :class:`UserInputError` saying why ``what``
    cannot be read: also when it is not a regular file. A FIFO would block the open until a
    writer came, forever if none does, and a device or a pipe may never end: such a file is
    opened without blocking, looked at, and refused."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        with contextlib.suppress(OSError):  # a socket cannot be opened ("no such device")
            _check_regular(os.stat(path).st_mode, path, what)
        raise UserInputError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    try:
        _check_regular(os.fstat(fd).st_mode, path, what)
        os.set_blocking(fd, True)  # a regular file never blocks; reads as usual from here
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _check_regular(mode: int, path: Path, what: str) -> None:
    """Refuse a file of ``mode`` that is not a regular file."""
    if stat.S_ISDIR(mode):
        raise UserInputError(f"cannot read {what} {path}: it is a directory, not a file")
    if not stat.S_ISREG(mode):
        raise UserInputError(
            f"{what} {path} is not a regular file (a pipe, a device or a socket, which may "
            "never end): save its content to a file and give that"
        )


def read_text_file(path: Path, what: str) -> str:
    """A file's text (without the byte-order mark some editors put in front), or a
    :class:`UserInputError` saying why ``what`` cannot be read: also when it is not a regular
    file (see :func:`open_regular_file`) or holds more than :data:`MAX_TEXT_FILE_BYTES`."""
    limit = MAX_TEXT_FILE_BYTES
    with open_regular_file(path, what) as stream:
        try:
            data = stream.read(limit + 1)
        except OSError as exc:
            raise UserInputError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise UserInputError(
            f"{what} {path} is larger than {limit:,} bytes, far more than a plan or a goal "
            "needs: check that it is the file you meant"
        )
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise UserInputError(f"{what} {path} is not UTF-8 text") from None
    # Line ends as a file opened as text reads them (a goal's text keeps no \r).
    return text.replace("\r\n", "\n").replace("\r", "\n")


def parse_yaml_or_json(text: str, path: Path, what: str) -> Any:
    """The data in ``text`` (JSON for a ``.json`` file, else YAML), or a
    :class:`UserInputError` saying what is wrong with ``what``."""
    try:
        data = parse_data_text(text, json_syntax=path.suffix.lower() == ".json")
    except DataTextError as exc:
        raise UserInputError(f"{what} {path} {exc}") from None
    if data is None:
        raise UserInputError(f"{what} {path} is empty")
    return data


StrPath: TypeAlias = str | os.PathLike[str]
"""A path as the public API takes it: a :class:`~pathlib.Path`, or a ``str``."""
