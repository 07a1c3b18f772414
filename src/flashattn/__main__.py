"""``python -m flashattn``: the same command line as the ``flashattn`` script."""

from .cli import main

raise SystemExit(main())
