"""``python -m cli``: the ``fairgang`` command."""

from cli.main import main

main()
