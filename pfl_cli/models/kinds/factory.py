"""Model kind ``factory:MODULE:CALLABLE``: a user's Python callable that returns the client ``nn.Module``.

``MODULE`` is a dotted module importable from the working directory or the Python path
(``my_pkg.nets``), or a ``.py`` file (``nets.py``, ``./models/nets.py``). The callable is called with
``model_kwargs`` and, where its signature takes them and ``model_kwargs`` does not set them,
``num_classes`` (an int) and ``input_shape`` (a tuple, one sample's shape). The module's file is recorded
with its sha256: ``predict`` and ``--resume`` rebuild the net from the same code, and refuse a changed file.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from pathlib import Path

from torch import nn

from pfl_cli.errors import InputError

EXTRA = ""


def _parts(name: str) -> tuple[str, str]:
    module, sep, attr = name.rpartition(":")
    if not sep or not module or not attr.isidentifier():
        raise InputError(f"model_arch factory:{name}: must be factory:MODULE:CALLABLE (a dotted module or a .py "
                         "file, then the callable's name), e.g. factory:my_pkg.nets:make_net.")
    return module, attr


def _module(module: str):
    try:
        if module.endswith(".py"):
            path = Path(module).resolve()
            if not path.is_file():
                raise InputError(f"model_arch factory:{module}: no such file {path}.")
            spec = importlib.util.spec_from_file_location(f"pflx_factory_{path.stem}", path)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            return mod
        cwd = os.getcwd()
        added = cwd not in sys.path
        if added:  # as `python -m` would: the working directory's modules import
            sys.path.insert(0, cwd)
        try:
            return importlib.import_module(module)
        finally:
            if added:
                sys.path.remove(cwd)
    except InputError:
        raise
    except Exception as err:  # a user's module: whatever its import raises
        raise InputError(f"model_arch factory:{module}: importing it failed ({type(err).__name__}: {err}).") from None


def source(name: str) -> Path | None:
    module, _ = _parts(name)
    path = getattr(_module(module), "__file__", None)
    return Path(path).resolve() if path else None


def make(name: str, input_shape, num_classes: int, kwargs: dict) -> nn.Module:
    module, attr = _parts(name)
    fn = getattr(_module(module), attr, None)
    if not callable(fn):
        raise InputError(f"model_arch factory:{name}: module {module!r} has no callable {attr!r}.")
    options = dict(kwargs)
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    for key, value in (("num_classes", int(num_classes)), ("input_shape", tuple(input_shape))):
        if key not in options and (key in params or takes_any):
            options[key] = value
    try:
        model = fn(**options)
    except Exception as err:  # a user's callable: whatever it raises on these arguments
        raise InputError(f"model_arch factory:{name}({', '.join(options)}): {type(err).__name__}: {err}.") from None
    if not isinstance(model, nn.Module):
        raise InputError(f"model_arch factory:{name} must return a torch.nn.Module; got {type(model).__name__}.")
    return model
