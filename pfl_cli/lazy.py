"""Names of a package that load on first use (PEP 562), so that importing the package loads none of its modules.

>>> import json.decoder
>>> __getattr__, __dir__ = lazy_names("json", {"JSONDecoder": "decoder"})
>>> __getattr__("JSONDecoder") is json.decoder.JSONDecoder
True

A package writes ``__getattr__, __dir__ = lazy_names(__name__, WHERE)`` with ``WHERE`` {name: its submodule}: the
first read of a name imports ``package.submodule`` and keeps the value in the package, so that later reads are plain
attribute reads. Nothing here imports beyond the standard library.
"""

from __future__ import annotations

import importlib
import sys


def lazy_names(package: str, where: dict[str, str]):
    """The module-level ``__getattr__`` and ``__dir__`` of ``package`` whose names ``where`` {name: submodule}."""

    def __getattr__(name: str):
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{where[name]}"), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *where})

    return __getattr__, __dir__
