"""Where a benchmark's figures come from: the code that made them and the price they are at.

:func:`code_version` names hierplan's version and, when the package runs from a git checkout,
the commit and whether the package's source differs from it (``dirty``, with a digest of the
difference, so that two different uncommitted states do not pass for one). Only the package's
own directory counts: benchmark output written into the checkout (``benchmarks/``, ``runs/``)
does not make the code dirty. Outside a checkout (an installed wheel) the commit is ``None``.
"""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Mapping
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

from hierplan.pricing import PriceTable

# The package's own directory: hierplan/bench/provenance.py is two levels below it.
PACKAGE_DIR = Path(__file__).resolve().parents[1]

_GIT_TIMEOUT_S = 10.0


def _git(root: Path, *args: str) -> bytes | None:
    """``git args`` in ``root``; ``None`` when git is missing, fails or takes too long."""
    try:
        done = subprocess.run(
            ["git", "-C", str(root), *args],
            capture_output=True,
            timeout=_GIT_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


@cache
def code_version() -> dict[str, Any]:
    """``{"hierplan_version", "commit", "dirty", "source_digest"}`` of the running code (the
    last two ``None`` outside a git checkout; the digest ``None`` when the code is clean)."""
    package = PACKAGE_DIR
    try:
        version = metadata.version("hierplan")
    except metadata.PackageNotFoundError:
        version = "0+unknown"
    found: dict[str, Any] = {
        "hierplan_version": version,
        "commit": None,
        "dirty": None,
        "source_digest": None,
    }
    head = _git(package, "rev-parse", "HEAD")
    if head is None:
        return found
    found["commit"] = head.decode().strip()
    # Changes to tracked files of the package, and files in it git does not know yet.
    diff = _git(package, "diff", "HEAD", "--binary", "--", ".") or b""
    untracked = _git(package, "ls-files", "--others", "--exclude-standard", "--", ".") or b""
    found["dirty"] = bool(diff or untracked)
    if found["dirty"]:
        digest = hashlib.sha256(diff)
        for name in sorted(untracked.decode().splitlines()):
            digest.update(name.encode())
            try:
                digest.update((package / name).read_bytes())
            except OSError:
                continue
        found["source_digest"] = digest.hexdigest()[:16]
    return found


def describe_version(version: Mapping[str, Any]) -> str:
    """``hierplan 0.1.0 at 1a2b3c4d5e6f (dirty)`` for tables and notes."""
    text = f"hierplan {version.get('hierplan_version')}"
    commit = version.get("commit")
    if commit:
        text += f" at {str(commit)[:12]}"
        if version.get("dirty"):
            text += f" with uncommitted changes ({version.get('source_digest')})"
    else:
        text += " (not a git checkout: no commit known)"
    return text


def price_of(model: str, pricing: PriceTable | None = None) -> dict[str, Any]:
    """The price ``model`` (a model string, priced as itself) is charged at, as flat fields:
    ``price_model``, USD per million input, cached input and output tokens, and where and
    when the price was read. Unknown prices are ``None``."""
    price = (pricing or PriceTable()).lookup(model)
    return {
        "price_model": model,
        "price_in_per_mtok": None if price is None else price.input_per_mtok,
        "price_cached_in_per_mtok": None if price is None else price.cached_input_per_mtok,
        "price_out_per_mtok": None if price is None else price.output_per_mtok,
        "price_as_of": None if price is None else price.as_of or None,
        "price_table": (pricing or PriceTable()).version,
    }
