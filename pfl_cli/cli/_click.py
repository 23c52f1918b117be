"""The click that typer runs on: typer >= 0.2x vendors its own copy as ``typer._click``.

Exceptions must be caught from the copy typer actually raises, so import them from here.
"""

from __future__ import annotations

try:  # vendored click (typer 0.2x and later)
    from typer._click import exceptions as exceptions
except ImportError:  # pragma: no cover - older typer on upstream click
    from click import exceptions as exceptions  # type: ignore[no-redef]

UsageError = exceptions.UsageError
NoArgsIsHelpError = getattr(exceptions, "NoArgsIsHelpError", ())
Exit = exceptions.Exit if hasattr(exceptions, "Exit") else __import__("typer").Exit
Abort = exceptions.Abort if hasattr(exceptions, "Abort") else __import__("typer").Abort


def given_on_command_line(ctx, name: str) -> bool:
    """Whether option ``name`` was typed by the user (compared by name: enums differ per copy)."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "COMMANDLINE"


# ---------------------------------------------------------------------------- start-up: coercion without pydantic
# The typer releases that depend on pydantic (0.29 here; 0.20 does not) coerce every parameter's value
# through a pydantic TypeAdapter, and importing pydantic costs ~0.1 s of CPU, as much as numpy: a third
# of `pflx show`'s start-up. pflx's flags are plain str, bool, int, float, Path and Enum values (and lists
# of them); for those, :func:`install_lean_coercion` gives each parameter a coercion that calls typer's
# own pydantic-free helpers and returns what typer's adapter returns. Anything it does not accept (a value
# to refuse, another type) goes to typer's own coercion, so typer's messages and rules stay the only
# ones. tests/cli/test_plain_install.py holds the two equal on every parameter of pflx.
_NUMBER = {int: r"[+-]?\d+", float: r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?"}
_LEAN: list = []


def _lean_builder():
    """``build(param)``: the lean coercion of a typer parameter, or None (typer's own). Built on first
    use: typer's RuntimeParam exists only in the releases that coerce through pydantic."""
    if _LEAN:
        return _LEAN[0]
    import re
    from dataclasses import dataclass
    from enum import Enum
    from typing import Any

    from typer._coercion import RuntimeParam, build_runtime_param
    from typer._param_types import coerce_cli_choice, coerce_cli_path, routes_to_path

    refuse = object()

    def lean_kind(annotation, info) -> str | None:
        if getattr(info, "parser", None) is not None or getattr(info, "click_type", None) is not None:
            return None
        if annotation in _NUMBER:
            unbounded = info.min is None and info.max is None and not info.clamp
            return annotation.__name__ if unbounded else None
        if annotation in (str, bool):
            return annotation.__name__
        if isinstance(annotation, type) and issubclass(annotation, Enum):
            return "choice"
        if routes_to_path(annotation, info):
            return "path"
        return None

    @dataclass(frozen=True)
    class LeanRuntimeParam(RuntimeParam):
        kind: str
        many: bool
        descriptor: Any

        def _coerce_value(self, value, param, ctx):
            items = value if self.many else (value,)
            if self.many and not isinstance(value, (list, tuple)):
                items = refuse
            out = refuse if items is refuse else [self._item(v, param, ctx) for v in items]
            if out is refuse or any(v is refuse for v in out):  # typer's own coercion decides, and says why
                return build_runtime_param(self.descriptor)._coerce_value(value, param=param, ctx=ctx)
            return list(out) if self.many else out[0]

        def _item(self, value, param, ctx):
            kind, info, annotation = self.kind, self.parameter_info, self.annotation_item
            if kind in ("str", "bool"):  # text as typed; a flag's True/False (text goes to typer)
                return value if isinstance(value, str if kind == "str" else bool) else refuse
            if kind in ("int", "float"):
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    ok = kind == "float" or isinstance(value, int)
                    return (float(value) if kind == "float" else value) if ok else refuse
                if isinstance(value, str) and re.fullmatch(_NUMBER[annotation], value):
                    return annotation(value)
                return refuse
            try:
                if kind == "choice":
                    return coerce_cli_choice(value, choices=tuple(annotation), case_sensitive=info.case_sensitive,
                                             ctx=ctx)
                path_type = info.path_type or (annotation if isinstance(annotation, type) else None)
                if isinstance(path_type, type) and isinstance(value, str) and value and "\0" not in value:
                    value = path_type(value)  # what typer's pydantic Path adapter makes of the text
                return coerce_cli_path(value, info, path_type=path_type, param=param, ctx=ctx)
            except Exception:  # noqa: BLE001 - a value to refuse: typer's coercion raises its own error
                return refuse

        @property
        def annotation_item(self):
            from typing import get_args

            return get_args(self.annotation)[0] if self.many else self.annotation

    def build(param):
        desc = param.type_descriptor
        annotation, many = desc.annotation, False
        if desc.is_list:
            from typing import get_args

            (annotation,) = get_args(desc.annotation)
            many = True
        elif desc.is_tuple or desc.is_file or desc.is_datetime:
            return None
        kind = lean_kind(annotation, desc.parameter_info)
        if kind is None:
            return None
        return LeanRuntimeParam(desc.parameter_info, desc.annotation, kind, many, desc)

    _LEAN.append(build)
    return build


def install_lean_coercion() -> None:
    """Coerce typer's parameter values without importing pydantic where typer would (see above).

    Installed once on typer's parameter class, where typer builds a parameter's coercion on first use,
    so it covers every parameter, the help options typer creates on demand included.
    """
    try:
        from typer.core import _TyperParameter

        build = _lean_builder()
    except (ImportError, AttributeError):  # a typer without pydantic (click's types), or other internals
        return
    if getattr(_TyperParameter, "_pflx_lean", False):
        return
    typers_own = _TyperParameter.get_runtime_param

    def get_runtime_param(self):
        if self._runtime_param is None:
            self._runtime_param = build(self)  # None (typer's own) for anything but the plain types
        return typers_own(self)

    _TyperParameter.get_runtime_param = get_runtime_param
    _TyperParameter._pflx_lean = True
