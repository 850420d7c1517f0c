"""End-to-end tests with real third-party programs (Chromium, Arize Phoenix).

They are marked ``e2e`` and left out of ``make test``; ``make e2e`` and ``.ci/run`` install what
they need and run them. A missing prerequisite fails the test with what to install: it never
skips, so CI cannot pass without having run them.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HIERPLAN = [sys.executable, "-c", "from hierplan.cli import main; main()"]


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def hierplan(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the ``hierplan`` command; fail the test with its output if it fails.

    Exit status 1 (a run that did not succeed: the simulator's noise makes a demo run fail now
    and then) is accepted, since such a run is recorded and traced like any other.
    """
    done = subprocess.run([*HIERPLAN, *args], capture_output=True, text=True, env=env, timeout=600)
    failed = f"hierplan {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    assert done.returncode in (0, 1) and not done.stderr, failed
    return done


def ran(tree: dict[str, Any]) -> list[str]:
    """Paths of the nodes of a run.json tree that started (only those have spans)."""
    stack, out = [tree], []
    while stack:
        node = stack.pop()
        stack.extend(node["children"])
        if node["started_at"] is not None:
            out.append(node["path"])
    return out
