from dataclasses import dataclass

import pytest

from pfl_cli.config import load_config_file, parse_overrides, resolve_config
from pfl_cli.errors import ConfigError


@dataclass(frozen=True)
class Cfg:
    num_clients: int = 10
    alpha: float | None = None
    seed: int = 0


def test_overrides_split_on_first_equals_and_parse_yaml():
    got = parse_overrides(["num-clients=20", "alpha=0.1", "name=a=b", "xs=[1, 2]"])
    assert got == {"num_clients": 20, "alpha": 0.1, "name": "a=b", "xs": [1, 2]}


def test_override_without_equals_is_refused():
    with pytest.raises(ConfigError, match="--set takes key=value; got 'alpha'"):
        parse_overrides(["alpha"])


def test_precedence_defaults_file_flags_set():
    cfg = resolve_config(
        Cfg,
        file_values={"num_clients": 5, "alpha": 0.3, "seed": 1},
        flag_values={"alpha": 0.2, "seed": 2},
        overrides={"seed": 3},
    )
    assert cfg == Cfg(num_clients=5, alpha=0.2, seed=3)


def test_unknown_key_suggests_the_close_one():
    with pytest.raises(ConfigError, match="unknown --set key 'num_client'.*Did you mean 'num_clients'"):
        resolve_config(Cfg, overrides={"num_client": 3})


def test_recipe_section_and_shared_scalars(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("seed: 7\nout_root: runs\npartition:\n  num-clients: 4\ntrain:\n  rounds: 3\n")
    assert load_config_file(path, "partition") == {"seed": 7, "out_root": "runs", "num_clients": 4}
    flat = tmp_path / "f.yaml"
    flat.write_text("alpha: 0.5\n")
    assert load_config_file(flat, "partition") == {"alpha": 0.5}


@pytest.mark.parametrize("text, match", [("- a\n- b\n", "expected a mapping"), ("a: [1\n", "not valid YAML")])
def test_bad_config_files(tmp_path, text, match):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_config_file(path, "partition")


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_config_file(tmp_path / "nope.yaml", "partition")
