"""Search-space specs: parsing, the algorithm's keys and types, and the keys no search may touch."""

import pytest

from pfl_cli import registry
from pfl_cli.errors import ConfigError
from pfl_cli.tune.space import declared_space, parse_space_args, parse_spec, resolve_space


def test_specs_parse_to_their_ranges_and_typed_choices():
    assert parse_spec("lr", "log:1e-3:1").low == pytest.approx(1e-3)
    assert parse_spec("k", "int:1:50").high == 50
    (p,) = resolve_space(registry.get("fedprox"), {"mu": "choice:0,0.1,1"})[1:]
    assert p.choices == (0.0, 0.1, 1.0) and all(isinstance(c, float) for c in p.choices)
    assert p.labels == ("0", "0.1", "1")


@pytest.mark.parametrize("spec, message", [
    ("", "expected KIND"),
    ("log1e-3", "expected KIND"),
    ("log1e-3:1", "KIND must be one of"),
    ("exp:1:2", "KIND must be one of"),
    ("log:1:1", "LOW must be < HIGH"),
    ("float:2:1", "LOW must be < HIGH"),
    ("log:0:1", "LOW > 0"),
    ("log:-1:1", "LOW > 0"),
    ("log:1e-3", "two bounds"),
    ("float:a:1", "must be a number"),
    ("float:nan:1", "finite"),
    ("choice:", "at least one value"),
    ("choice:a,a", "twice"),
])
def test_malformed_specs_are_refused_naming_the_key(spec, message):
    with pytest.raises(ConfigError, match=message) as err:
        parse_spec("lr", spec)
    assert str(err.value).startswith("--space lr:")


@pytest.mark.parametrize("items, message", [
    (["lr"], "expected KEY=SPEC"),
    (["=log:1:2"], "expected KEY=SPEC"),
    (["lr="], "expected KEY=SPEC"),
    (["lr=log:1e-3:1", "lr=log:1e-2:1"], "given twice"),
])
def test_malformed_space_arguments(items, message):
    with pytest.raises(ConfigError, match=message):
        parse_space_args(items)


@pytest.mark.parametrize("override, message", [
    ({"lrr": "log:1e-3:1"}, r"unknown --space key 'lrr' for algorithm 'fedavg' \(did you mean 'lr'\?\)"),
    ({"mu": "float:0:1"}, "unknown --space key 'mu'"),        # fedprox's key, not fedavg's
    ({"lr": "int:1:5"}, "float key, an int range does not fit"),
    ({"local_steps": "log:1:100"}, "integer key; use int:LOW:HIGH"),
    ({"model_arch": "float:0:1"}, "not a number; search it with choice"),
    ({"model_arch": "choice:mlp,resnet"}, "model_arch must be one of"),
    ({"lr": "float:-1:1"}, "lr"),                             # a bound breaks the key's own rule (lr > 0)
    ({"dp_epsilon": "float:1:8"}, "dp_epsilon cannot be searched"),
    ({"dp_clip": "log:0.1:10"}, "dp_clip cannot be searched"),
    ({"seed": "int:0:9"}, "seed cannot be searched"),
])
def test_a_space_is_checked_against_the_algorithm(override, message):
    with pytest.raises(ConfigError, match=message):
        resolve_space(registry.get("fedavg"), override)


def test_every_algorithm_declares_a_valid_space_with_a_source():
    for entry in registry.entries().values():
        if entry.origin != "built-in":
            continue
        cls = entry.algorithm
        assert cls.search_space, f"{entry.name} declares no search space"
        assert cls.search_space_source and "specs/" not in cls.search_space_source
        assert cls.tune_group in ("train", "new")
        params = resolve_space(entry)  # every declared key and spec passes the same checks as --space
        assert [p.key for p in params] == list(declared_space(cls))


def test_override_replaces_a_declared_key_and_adds_another():
    params = resolve_space(registry.get("fedprox"), {"mu": "log:1e-4:1", "local_steps": "int:5:50"})
    assert {p.key: p.spec() for p in params} == {"lr": "log:0.001:1", "mu": "log:0.0001:1",
                                                 "local_steps": "int:5:50"}


def _tuple_keys():
    """Every (algorithm, key) whose declared type is a tuple (mlp_hidden, FedNova's optional local_epochs_range)."""
    import typing

    from pfl_cli.schema import field_types

    out = []
    for name, entry in registry.entries().items():
        types = field_types(entry.config)
        for key in entry.keys:
            tp = types[key]
            arms = [a for a in typing.get_args(tp) if a is not type(None)] if typing.get_origin(tp) is typing.Union \
                else [tp]
            if any(a is tuple or typing.get_origin(a) is tuple for a in arms):
                out.append(pytest.param(name, key, id=f"{name}-{key}"))
    return out


@pytest.mark.parametrize("name, key", _tuple_keys())
def test_a_tuple_key_is_searched_over_choices_of_lists(name, key):
    """``--space KEY=choice:[1,2],[2,3]`` searches a tuple key over those tuples (generated over the registry: a
    new tuple key is covered). A choice's commas inside brackets belong to its value: the split on every comma
    gave '[1' and '2]' and a refusal naming --set, so no tuple of two or more entries could be searched."""
    import dataclasses

    entry = registry.get(name)
    default = getattr(entry.config(), key)
    values = [default, default + default] if default else [(1, 2), (2, 3)]
    taken = []
    for value in values:
        try:
            dataclasses.replace(entry.config(), **{key: value}).validate()
        except ConfigError:
            continue
        taken.append(value)
    assert len(taken) == 2, (name, key, values)
    spec = "choice:" + ",".join("[" + ", ".join(map(str, v)) + "]" for v in taken)
    params = [p for p in resolve_space(entry, {key: spec}) if p.key == key]
    assert len(params) == 1 and params[0].choices == tuple(taken), (spec, params)
    assert params[0].spec() == spec  # what the study stores and trials.csv shows: the values as typed


def test_a_bad_choice_value_names_space_not_set():
    with pytest.raises(ConfigError, match=r"^--space local_epochs_range: ") as err:
        resolve_space(registry.get("fednova"), {"local_epochs_range": "choice:[1,2],[2,"})
    assert "--set" not in str(err.value)


def test_a_list_of_values_is_a_choice_among_them():
    """`--space lr=[0.1,0.01]` and a spec's `space: {lr: [0.1, 0.01]}` are `choice:0.1,0.01` (issue 49, item 5)."""
    from pfl_cli import registry
    from pfl_cli.compare.spec import parse_spec as parse_compare_spec
    from pfl_cli.tune.space import parse_spec, resolve_space

    assert parse_spec("lr", "[0.1,0.01]") == parse_spec("lr", "choice:0.1,0.01")
    lr, hidden = resolve_space(registry.get("fedavg"), {"lr": "[0.1, 0.01]", "mlp_hidden": "[[32], [64, 64]]"})
    assert (lr.kind, lr.choices, hidden.choices) == ("choice", (0.1, 0.01), ((32,), (64, 64)))
    spec = parse_compare_spec({"partition": "p", "seeds": [0], "algorithms": {"fedavg": {"tune": {
        "trials": 2, "space": {"lr": [0.1, 0.01], "mlp_hidden": [[32], [64, 64]], "server_optimizer": ["sgd", "adam"]}}}}})
    assert dict(spec.algorithms[0].tune.space) == {"lr": "choice:0.1,0.01", "mlp_hidden": "choice:[32],[64, 64]",
                                                   "server_optimizer": "choice:sgd,adam"}
    with pytest.raises(ConfigError, match="choice needs at least one value"):
        parse_spec("lr", "[]")
