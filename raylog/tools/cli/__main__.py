"""``python -m raylog.tools.cli``: the ``raylog`` command line."""

from raylog.tools.cli import main

main()
