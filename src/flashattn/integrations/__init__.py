"""Integrations with other libraries; each module registers flashattn when it is imported.

Each one imports its library, so none loads with ``import flashattn``: ``flashattn.integrations.transformers``
is imported on first access, as by ``import flashattn.integrations.transformers``.
"""

import importlib

_MODULES = ("transformers",)


def __getattr__(name: str):
    if name in _MODULES:  # import_module, not ``from . import``: that would look the name up here again
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_MODULES})
