"""``python -m hierplan`` runs the CLI."""

from hierplan.cli import main

main()
