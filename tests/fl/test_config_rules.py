"""``check_own_keys``: the range checks of the algorithms' own keys, one message shape for all."""

import math

import pytest

from pfl_cli.errors import ConfigError
from pfl_cli.fl.config import OWN_RULES, check_own_keys
from pfl_cli.registry import train_config

# each rule: values it takes, values it refuses (bools are never numbers)
CASES = {
    "an integer >= 0": ([0, 3], [-1, 1.0, True, None]),
    "an integer >= 1": ([1, 7], [0, 2.5, False]),
    "a finite number >= 0": ([0, 0.0, 2, 1e9], [-1e-9, math.nan, math.inf, True, "1"]),
    "a finite number > 0": ([1e-12, 3], [0, 0.0, -1, math.nan, math.inf, False]),
    "a number in (0, 1]": ([1, 0.5, 1e-9], [0, 1.0001, math.nan, True]),
    "a fraction in (0, 1]": ([1, 0.25], [0.0, 2, -0.5, math.inf]),
    "a number in [0, 1]": ([0, 1, 0.5], [-1e-9, 1.0001, math.nan, True, math.inf]),
}


def test_every_rule_is_tested():
    assert set(CASES) == set(OWN_RULES)


@pytest.mark.parametrize("rule", CASES)
def test_each_rule_takes_and_refuses_its_values_naming_key_rule_algorithm_and_value(rule):
    cfg = train_config("fedcp")
    good, bad = CASES[rule]
    for value in good:
        object.__setattr__(cfg, "fedcp_tau", value)  # frozen: the checker reads whatever the field holds
        check_own_keys(cfg, {"fedcp_tau": rule})
    for value in bad:
        object.__setattr__(cfg, "fedcp_tau", value)
        with pytest.raises(ConfigError) as err:
            check_own_keys(cfg, {"fedcp_tau": rule})
        assert str(err.value) == f"fedcp_tau must be {rule} for fedcp; got {value!r}."


def test_the_first_broken_key_is_named_and_none_passes_for_an_optional_key():
    cfg = train_config("fedpac", fedpac_lambda=None)
    check_own_keys(cfg, {"fedpac_lambda": "a finite number >= 0", "head_epochs": "an integer >= 0"})
    object.__setattr__(cfg, "head_lr", -1.0)
    object.__setattr__(cfg, "body_epochs", -1)
    with pytest.raises(ConfigError, match=r"^head_lr must be a finite number > 0 for fedpac; got -1.0\.$"):
        check_own_keys(cfg, {"head_lr": "a finite number > 0", "body_epochs": "an integer >= 0"})
    object.__setattr__(cfg, "head_epochs", None)  # not optional: None is refused
    with pytest.raises(ConfigError, match="head_epochs must be an integer >= 0 for fedpac; got None"):
        check_own_keys(cfg, {"head_epochs": "an integer >= 0"})
