"""The ``hierplan`` command's entry point; ``python -m hierplan`` runs it too.

Importing a command loads most of hierplan and the libraries it stands on, which takes most of
a second. A Ctrl-C meanwhile raises ``KeyboardInterrupt`` in whatever module is being imported;
:func:`main` is ready for it before that import starts (this module and the package
import nothing heavy), so that it ends as an interrupted command does: one line, exit status
130, no traceback.
"""

from __future__ import annotations

import sys
from typing import NoReturn

EXIT_INTERRUPTED = 130
"""The exit status after Ctrl-C (128 + SIGINT), as a shell reports an interrupted command."""

_BEFORE_START = " before the command started: nothing ran"


def main() -> None:
    """Run the ``hierplan`` command line (:func:`hierplan.cli.main`)."""
    try:
        from hierplan.cli import main as cli_main
        from hierplan.cli.lazy import InterruptedBeforeStart
    except KeyboardInterrupt:
        _interrupted(_BEFORE_START)
    try:
        cli_main()
    except InterruptedBeforeStart:  # while the named command's own module was imported
        _interrupted(_BEFORE_START)
    except KeyboardInterrupt:
        # The command handles Ctrl-C during its work; this is one that came before it was
        # ready (while its arguments were read, say), or after.
        _interrupted("")


def _interrupted(when: str) -> NoReturn:
    sys.stderr.write(f"error: interrupted (Ctrl-C){when}\n")
    sys.exit(EXIT_INTERRUPTED)


if __name__ == "__main__":
    main()
