"""Typed config values (pfl_cli.schema) and the YAML 1.2 reader (pfl_cli.yaml12)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, Optional

import pytest
import yaml

from pfl_cli import yaml12
from pfl_cli.config import load_config_file, resolve_config
from pfl_cli.errors import ConfigError
from pfl_cli.schema import coerce_field, register_choices


@dataclass(frozen=True)
class Cfg:
    flag: bool = False
    maybe: Optional[bool] = None
    count: int = 1
    rate: float = 0.5
    wild: float = field(default=1.0, metadata={"allow_nonfinite": True})
    name: str = "a"
    mode: str = "x"
    kind: Literal["p", "q"] = "p"
    widths: tuple = (32,)
    shares: list[float] | None = None
    alpha: float | list[float] | None = None
    seed: int = 0


register_choices(Cfg, mode=("x", "y"))


@pytest.mark.parametrize("text,value", [("true", True), ("false", False), ("True", True), ("FALSE", False),
                                        ("yes", "yes"), ("no", "no"), ("on", "on"), ("1e-3", 1e-3), ("017", 17),
                                        ("0o17", 15), ("0x1f", 31), (".inf", math.inf), ("~", None),
                                        ("2020-01-01", "2020-01-01"), ("1_000", "1_000")])
def test_yaml_1_2_core_schema(text, value):
    assert yaml12.loads(text) == value and type(yaml12.loads(text)) is type(value)


def test_yaml_duplicate_keys_are_refused_at_every_depth():
    with pytest.raises(yaml.YAMLError, match="duplicate key 'a'"):
        yaml12.loads("a: 1\nb: 2\na: 3\n")
    with pytest.raises(yaml.YAMLError, match="duplicate key 'k'"):
        yaml12.loads("train:\n  k: 1\n  k: 2\n")
    assert yaml12.loads("a: {k: 1}\nb: {k: 2}\n") == {"a": {"k": 1}, "b": {"k": 2}}


@pytest.mark.parametrize("name,value,message", [
    ("flag", "false", "flag must be true or false; got 'false'."),
    ("flag", "perhaps", "flag must be true or false; got 'perhaps'."),
    ("flag", 1, "flag must be true or false; got 1."),
    ("maybe", "no", "maybe must be true or false; got 'no'."),
    ("count", 1.5, "count must be an integer; got 1.5."),
    ("count", True, "count must be an integer; got true."),
    ("count", "ten", "count must be an integer; got 'ten'."),
    ("rate", math.nan, "rate must be a finite number; got nan."),
    ("rate", "nan", "rate must be a finite number; got nan."),
    ("rate", -math.inf, "rate must be a finite number; got -inf."),
    ("rate", [1], "rate must be a number; got [1]."),
    ("name", [1, 2], "name must be a string; got [1, 2]."),
    ("mode", "z", "mode must be one of x, y; got 'z'."),
    ("kind", "r", "kind must be one of p, q; got 'r'."),
    ("widths", {"a": 1}, "widths must be a list; got {'a': 1}."),
    ("shares", ["a"], "shares must be a list of numbers; got ['a']."),
    ("seed", -1, "seed must be an integer >= 0; got -1."),
])
def test_refused_values_name_the_rule_and_the_value(name, value, message):
    with pytest.raises(ConfigError) as err:
        coerce_field(Cfg, name, value)
    assert str(err.value) == message


@pytest.mark.parametrize("name,value,parsed", [
    ("flag", True, True), ("maybe", None, None), ("count", "12", 12), ("rate", 1, 1.0), ("rate", "1e-3", 1e-3),
    ("wild", math.inf, math.inf), ("name", 5, "5"), ("widths", 16, (16,)), ("widths", [8, 4], (8, 4)),
    ("shares", [1, 0.5], [1.0, 0.5]), ("alpha", 0.1, 0.1), ("alpha", [0.1, 1], [0.1, 1.0]), ("mode", "y", "y"),
])
def test_accepted_values_are_typed(name, value, parsed):
    got = coerce_field(Cfg, name, value)
    assert got == parsed and type(got) is type(parsed)


def test_layers_are_typed_and_refused_alike(tmp_path):
    cfg = resolve_config(Cfg, file_values={"rate": 1}, flag_values={"count": 3}, overrides={"flag": True})
    assert cfg.rate == 1.0 and type(cfg.rate) is float and cfg.count == 3 and cfg.flag is True
    messages = set()
    for layer in ("file_values", "flag_values", "overrides"):
        with pytest.raises(ConfigError) as err:
            resolve_config(Cfg, **{layer: {"flag": "perhaps"}})
        messages.add(str(err.value))
    assert messages == {"flag must be true or false; got 'perhaps'."}


def test_config_files_must_be_utf8_with_unique_string_keys(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_bytes(b"name: caf\xe9\n")
    with pytest.raises(ConfigError, match=r"not UTF-8 text \(byte 0xe9 at offset 9\)"):
        load_config_file(path, "partition")
    path.write_text("num-clients: 3\nnum_clients: 4\n")
    with pytest.raises(ConfigError, match="duplicate key 'num_clients'"):
        load_config_file(path, "partition")
    path.write_text("1: 2\n")
    with pytest.raises(ConfigError, match="keys must be option names; got 1"):
        load_config_file(path, "partition")
    path.write_bytes(b"\xef\xbb\xbfseed: 3\n")  # a byte-order mark is fine
    assert load_config_file(path, "partition") == {"seed": 3}
