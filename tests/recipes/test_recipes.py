"""Every recipe loads and resolves against its stages' configs (recursive glob)."""

import importlib
import pathlib

import pytest
import yaml

from pfl_cli.config import STAGES, load_config_file, resolve_config

ROOT = pathlib.Path(__file__).resolve().parents[2] / "recipes"
RECIPES = sorted(ROOT.rglob("*.yaml"))

# stage -> (module, config dataclass); a stage whose module is absent is not in pflx yet.
CONFIG_CLASSES = {
    "partition": ("pfl_cli.partition", "PartitionConfig"),
    "mdm-fit": ("pfl_cli.mdm.api", "MDMFitConfig"),
    "simulate": ("pfl_cli.simulate", "SimulateConfig"),
    "cluster": ("pfl_cli.cluster", "ClusterConfig"),
    "privacy-account": ("pfl_cli.privacy.query", "PrivacyAccountConfig"),
    "predict": ("pfl_cli.fl.config", "PredictConfig"),
    "attack": ("pfl_cli.attack.config", "AttackConfig"),
}


def test_there_are_recipes():
    assert len(RECIPES) >= 2


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: str(p.relative_to(ROOT)))
def test_recipe_resolves(path):
    text = path.read_text()
    assert text.startswith("#"), "a recipe opens with a header naming the paper/figure and the commands"
    data = yaml.safe_load(text)
    if "algorithms" in data and "seeds" in data:  # a `pflx compare --spec` file: parsed as the command parses it
        from pfl_cli.compare.spec import parse_spec

        assert parse_spec(data, where=str(path)).algorithms
        return
    stages = [s for s in STAGES if isinstance(data.get(s), dict)]
    assert stages, "a recipe has at least one stage section"
    if "train" in stages:
        check_train_section(path, data)
    for stage in stages:
        if stage in CONFIG_CLASSES:
            module, name = CONFIG_CLASSES[stage]
            cls = getattr(importlib.import_module(module), name)
            resolve_config(cls, file_values=load_config_file(path, stage), ignore=("out_root",))


def check_train_section(path, data):
    """A train section resolves to its algorithm's own config; a comparison recipe's shared section goes to
    each algorithm where it takes the key (recipes/compare/algorithm_args.py), its compare: keys on top."""
    from pfl_cli import registry

    values = load_config_file(path, "train")
    if "compare" not in data:
        registry.resolve_train_config(file_values=values, ignore=("out_root",))
        # a recipe shared by algorithms: each one's section under train: resolves with the shared keys
        for name in (k for k, v in data["train"].items() if isinstance(v, dict)):
            cfg = registry.resolve_train_config(file_values=values, overrides={"algorithm": name}, ignore=("out_root",))
            assert cfg.algorithm == name
        return
    unused = set(values) - {k for e in registry.entries().values() for k in e.keys}
    assert not unused, f"shared keys no algorithm takes: {unused}"
    for name, own in data["compare"].items():
        shared = {k: v for k, v in values.items() if k in registry.get(name).keys}
        registry.resolve_train_config(file_values={**shared, "algorithm": name}, overrides=own)
