"""``python -m flashattn``: the same command line as the ``flashattn`` script."""

from .tools.cli import main

raise SystemExit(main())
