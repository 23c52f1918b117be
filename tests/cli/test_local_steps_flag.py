"""--local-steps typed on an algorithm whose rounds count epochs by default selects step counting (issue 49, 11).

``pflx train -h`` says --local-steps sets "client SGD steps per round (every federated algorithm but fedrep)";
FedNova and FedOpt refused it (their defaults count epochs). Generated over the registry: every algorithm that
takes local_steps and sets local_epochs by default.
"""

import pytest

from pfl_cli import registry
from pfl_cli.errors import ConfigError

EPOCH_COUNTING = [n for n, e in registry.entries().items()
                  if "local_steps" in e.keys and getattr(e.config(), "local_epochs", None) is not None]


def test_the_suite_sees_the_algorithms_of_the_finding():
    assert {"fednova", "fedopt"} <= set(EPOCH_COUNTING)


@pytest.mark.parametrize("name", EPOCH_COUNTING)
def test_a_typed_local_steps_counts_steps(name):
    from pfl_cli.cli.common import train_stage_config

    for flags, sets in (({"algorithm": name, "local_steps": 20}, None), ({"algorithm": name}, ["local_steps=20"])):
        cfg = train_stage_config(config_file=None, flags=flags, sets=sets)
        assert cfg.local_steps == 20 and cfg.local_epochs is None
    # beside an explicit local_epochs the step count is still refused as ignored
    with pytest.raises(ConfigError, match="local_steps has no effect beside local_epochs"):
        train_stage_config(config_file=None, flags={"algorithm": name, "local_steps": 20}, sets=["local_epochs=2"])


def test_the_help_says_which_algorithms_count_epochs(cli):
    run = cli("train", "-h")
    assert "fednova, fedopt" in " ".join(run.out.split())
