"""The attack protocol (issue 22 part 3): the attack's hooks live in pfl_cli.attack.protocol, not in Algorithm."""

import ast
import pathlib

import pytest

from pfl_cli import registry
from pfl_cli.algorithms.base import Algorithm
from pfl_cli.attack.protocol import Attackable, attackable

ATTACK_MEMBERS = ("upload", "local_update", "leaked_gradients", "attack_private", "round_upload_steps",
                  "models_upload", "upload_under_dp")


def test_the_base_algorithm_has_no_attack_member():
    assert [m for m in ATTACK_MEMBERS if hasattr(Algorithm, m)] == []
    assert all(hasattr(Attackable, m) for m in ATTACK_MEMBERS)


def test_the_attacked_algorithms_are_those_whose_upload_was_modelled_before():
    """The set pflx attack served before the protocol (models_upload = True in Algorithm's subclasses)."""
    attacked = {e.name for e in registry.entries().values() if attackable(e.algorithm)}
    assert attacked == {"fedavg", "ditto", "knnper", "ldp-fedavg", "hyperfl", "hyperfl-lpm", "pefll", "pfedhn",
                        "pfedhn-pc"}
    # FedAvg's subclasses whose rounds differ inherit the hooks and say so
    for name in ("fedprox", "apfl", "perfedavg", "pfedme", "fedopt", "fedexp"):
        cls = registry.get(name).algorithm
        assert issubclass(cls, Attackable) and not cls.models_upload and not attackable(cls)
    under_dp = {e.name for e in registry.entries().values() if attackable(e.algorithm) and e.algorithm.upload_under_dp}
    assert under_dp == {"fedavg", "ditto", "knnper", "ldp-fedavg"}


def test_an_algorithm_without_the_mixin_is_not_attacked_and_the_mixin_needs_upload():
    class Plain(Algorithm):
        name = "plain"

    assert not attackable(Plain) and not attackable(object) and not attackable("fedavg")

    class NoUpload(Attackable):
        pass

    with pytest.raises(TypeError, match="upload"):
        NoUpload()


def test_the_protocol_imports_no_algorithm_and_no_registry():
    source = pathlib.Path(__file__).resolve().parents[2] / "pfl_cli" / "attack" / "protocol.py"
    imported = {n.module for n in ast.walk(ast.parse(source.read_text())) if isinstance(n, ast.ImportFrom)}
    assert not {m for m in imported if m and m.startswith(("pfl_cli.algorithms", "pfl_cli.registry"))}
