"""One schema per stage: a bad value is refused alike through a flag, a config file and --set.

Parametrized over every field of every stage config (derived from the dataclasses, so fields
added later are covered without an edit here) and the three routes. Each bad value is refused
before anything is read or written: exit 2, one identical line on stderr, no --out, no lock.
"""

from __future__ import annotations

import dataclasses
import types
import typing

import pytest

from pfl_cli import yaml12
from pfl_cli.config import STAGE_CONFIGS, stage_config_class
from pfl_cli.errors import ConfigError
from pfl_cli.schema import _choices, coerce_field, field_types

# Options a command requires before it looks at its config (paths that need not exist: the
# config is refused first).
REQUIRED = {"train": ["--partition", "nope"], "predict": ["--model", "nope", "--partition", "nope"],
            "cluster": ["--partition", "nope"]}
NO_OUT = {"privacy-account"}


def _bad_text(cls, name) -> str:
    """A value the field's declared type (or its choices) refuses, as it is typed on a command line."""
    tp = field_types(cls)[name]
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    base = args[0] if typing.get_origin(tp) in (typing.Union, types.UnionType) and len(args) == 1 else tp
    if _choices(cls, name):
        return "bogus-choice"
    if base is bool:
        return "perhaps"
    if base is int:
        return "1.5"
    if base is float:
        return "nan"
    if base is str:
        return "[1, 2]"
    if base is typing.Any:
        return "zero"
    return "{a: 1}"  # containers and unions of them: a mapping is none of them


CASES = [(stage, f.name) for stage in STAGE_CONFIGS for f in dataclasses.fields(stage_config_class(stage))]


def _flag(stage: str, name: str):
    """The command's own option for field ``name``, when it takes the value as text."""
    from pfl_cli.cli.app import _command

    command = _command().commands[stage]
    for param in command.params:
        if param.name == name and param.param_type_name == "option" and not param.is_flag:
            return param.opts[0]
    return None


def _expected(stage: str, name: str, text: str) -> str | None:
    try:
        coerce_field(stage_config_class(stage), name, yaml12.loads(text))
    except ConfigError as err:
        return f"pflx: error: {err}\n"
    return None  # a value only the stage's own validator refuses (e.g. components: zero)


@pytest.mark.parametrize("stage,name", CASES, ids=[f"{s}-{n}" for s, n in CASES])
def test_a_bad_value_reads_the_same_through_flag_config_and_set(cli, tmp_path, stage, name):
    cls = stage_config_class(stage)
    text = _bad_text(cls, name)
    out = tmp_path / "out"
    common = [stage, *REQUIRED.get(stage, []), *([] if stage in NO_OUT else ["--out", out])]
    config = tmp_path / "c.yaml"
    config.write_text(f"{name}: {text}\n")
    routes = {"set": [*common, "--set", f"{name}={text}"], "config": [*common, "--config", config]}
    flag = _flag(stage, name)
    # A flag's text is a string: a list given to a string field, or a container field's own flag syntax
    # (--split 0.1,0.2), has no wrong-type counterpart on the command line.
    if flag is not None and text not in ("[1, 2]", "{a: 1}"):
        routes["flag"] = [*common, flag, text]
    results = {route: cli(*args) for route, args in routes.items()}
    lines = {route: r.err for route, r in results.items()}
    expected = _expected(stage, name, text)
    for route, r in results.items():
        assert r.code == 2, (route, r.err)
        assert r.err.count("\n") == 1 and r.err.startswith("pflx: error:"), (route, r.err)
    assert len(set(lines.values())) == 1, lines
    if expected is not None:
        assert lines["set"] == expected
    assert not out.exists() and not list(tmp_path.glob(".out*"))


def test_every_field_of_every_stage_is_covered():
    # The parametrization above is derived, not listed: a new field is a new case.
    assert len(CASES) == sum(len(dataclasses.fields(stage_config_class(s))) for s in STAGE_CONFIGS) > 100


@pytest.mark.parametrize("args", [["--set", "no_dp=perhaps"], ["--set", "no_dp=yes"], ["--set", 'no_dp="false"'],
                                  ["--set", "no_dp=1"]])
def test_no_bool_but_true_turns_dp_off(cli, tmp_path, args):
    res = cli("cluster", "--partition", tmp_path / "p", "--k", "2", "--server-data", "builtin:digits",
              "--dp", "eps=1", "--out", tmp_path / "km", *args)
    assert res.code == 2 and "no_dp must be true or false" in res.err
