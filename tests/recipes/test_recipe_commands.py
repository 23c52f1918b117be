"""Every command a recipe's header shows runs as written (issue 34, item 8).

Each `pflx train` / `predict` / `attack` / `cluster` command of every recipe header goes through pflx's
own command line with its inputs pointed at a path that does not exist: the config (recipe sections,
flags, --set) must resolve, so the one error is the missing input. The recipes whose data ship with
pflx (builtin:digits, the ring) also run end to end at smoke size (slow tier), in the order the header
gives, and `make -f recipes/Makefile ... baselines` runs at ROUNDS=2.
"""

from __future__ import annotations

import pathlib
import shlex
import subprocess
import sys

import pytest
import yaml

from pfl_cli import registry

ROOT = pathlib.Path(__file__).resolve().parents[2]
RECIPES = sorted((ROOT / "recipes").rglob("*.yaml"))
INPUTS = ("--partition", "--model", "--counts")  # what a command reads; replaced by an absent path
CHECKED = ("train", "predict", "attack", "cluster")


def header_commands(path: pathlib.Path) -> list[list[str]]:
    """The `pflx ...` commands of a recipe's header comment (continuation lines joined), as argv lists."""
    cmds, cur = [], None
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        text = line[1:].strip()
        if cur is not None:
            cur += " " + text
        elif text.startswith("pflx "):
            cur = text
        else:
            continue
        if cur.endswith("\\"):
            cur = cur[:-1].rstrip()
        else:
            cmds.append(shlex.split(cur)[1:])
            cur = None
    return cmds


def _ids(items):
    return [f"{p.relative_to(ROOT / 'recipes')}:{i}" for p, i, _ in items]


COMMANDS = [(p, i, c) for p in RECIPES for i, c in enumerate(header_commands(p)) if c[0] in CHECKED]


def test_the_headers_show_commands():
    shown = {p.name for p, _, _ in COMMANDS}
    assert {"digits-pefll.yaml", "ring-pefll.yaml", "cifar10-100-clients.yaml", "lpm-table2.yaml"} <= shown
    # the baselines of a shared recipe are among them
    sets = [" ".join(c) for p, _, c in COMMANDS if p.name == "digits-pefll.yaml"]
    assert any("algorithm=fedavg" in c for c in sets) and any("algorithm=local" in c for c in sets)


def _with(args: list[str], replace: dict[str, str]) -> list[str]:
    out = list(args)
    for i, a in enumerate(out[:-1]):
        if a in replace:
            out[i + 1] = replace[a]
    return out


@pytest.mark.parametrize("path,index,args", COMMANDS, ids=_ids(COMMANDS))
def test_header_command_config_resolves(path, index, args, cli, tmp_path, monkeypatch):
    """The command's config is accepted: with its inputs absent, the one error names the first input."""
    monkeypatch.chdir(ROOT)
    absent = {flag: str(tmp_path / f"absent{flag[2:]}") for flag in INPUTS}
    run = cli(*_with(args, {**absent, "--out": str(tmp_path / "out")}))
    assert run.code == 2, (run.out, run.err)
    assert "absent" in run.err and "unknown" not in run.err and "key" not in run.err, run.err
    assert not (tmp_path / "out").exists()


def test_shared_recipe_sections_name_algorithms_and_their_keys():
    """A section under train: is an algorithm's, and holds only keys that algorithm takes."""
    for path in RECIPES:
        train = (yaml.safe_load(path.read_text()) or {}).get("train")
        if not isinstance(train, dict):
            continue
        for key, value in train.items():
            if isinstance(value, dict):
                assert key in registry.names(), f"{path}: train.{key} is no algorithm"
                unknown = {k.replace("-", "_") for k in value} - set(registry.get(key).keys)
                assert not unknown, f"{path}: train.{key} holds keys {key} does not take: {unknown}"


# --- smoke-size runs of the recipes whose data ship with pflx ---------------------------------------------

def _smoke(args: list[str], recipe: pathlib.Path) -> list[str]:
    """A train command at smoke size: 2 rounds (1 epoch where the algorithm counts epochs)."""
    if args[0] != "train":
        return args
    name = (yaml.safe_load(recipe.read_text())["train"] or {}).get("algorithm", "pefll")
    for i, a in enumerate(args[:-1]):
        if a == "--algorithm":
            name = args[i + 1]
        if a == "--set" and args[i + 1].startswith("algorithm="):
            name = args[i + 1].split("=", 1)[1]
    keys = registry.get(name).keys
    smoke = {"rounds": 2, "eval_every": 1, "local_epochs": 1, "local_steps": 2, "embed_rounds": 1}
    out = list(args)
    for k, v in smoke.items():
        if k in keys:
            out += ["--set", f"{k}={v}"]
    return out


def _local_data(path: pathlib.Path) -> bool:
    part = (yaml.safe_load(path.read_text()) or {}).get("partition") or {}
    return str(part.get("dataset", "")).startswith(("builtin:", "ring:"))


CHAINS = [p for p in RECIPES if _local_data(p) and any(c[0] == "train" for c in header_commands(p))
          and "flower" not in p.parts and "attack" not in p.parts]


def test_chains_cover_the_shared_quickstart_recipes():
    names = {p.name for p in CHAINS}
    assert {"digits-pefll.yaml", "ring-pefll.yaml", "digits-pfedhn-pc.yaml", "lpm-digits-smoke.yaml",
            "rotated-digits.yaml", "table-4-2.yaml"} <= names


@pytest.mark.slow
@pytest.mark.parametrize("path", CHAINS, ids=lambda p: str(p.relative_to(ROOT / "recipes")))
def test_header_commands_run_at_smoke_size(path, cli, tmp_path, monkeypatch):
    """partition, train (2 rounds), predict: as the header gives them, under tmp_path/runs."""
    monkeypatch.chdir(ROOT)
    runs = {}
    for args in header_commands(path):
        if args[0] not in ("partition", "train", "predict"):
            continue
        out = [str(tmp_path / a) if a.startswith("runs/") else a for a in _smoke(args, path)]
        run = cli(*out, "--format", "quiet")
        assert run.code == 0, (" ".join(out), run.err)
        assert (pathlib.Path(out[out.index("--out") + 1]) / "manifest.json").is_file()
        runs[args[0]] = runs.get(args[0], 0) + 1
    assert runs.get("train", 0) >= 1


@pytest.mark.slow
def test_makefile_baselines_at_two_rounds(tmp_path):
    """`make -f recipes/Makefile ROOT=... ROUNDS=2 baselines`: FedAvg and Local from the shared recipe."""
    cmd = ["make", "-s", "-f", "recipes/Makefile", f"ROOT={tmp_path}", "ROUNDS=2",
           f"PFLX={sys.executable} -m pfl_cli", "baselines"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    for name in ("fedavg", "local"):
        cfg = yaml.safe_load((tmp_path / name / "config.yaml").read_text())
        assert cfg["algorithm"] == name
        assert (tmp_path / f"{name}-holdout" / "metrics.json").is_file()
    assert yaml.safe_load((tmp_path / "fedavg" / "config.yaml").read_text())["lr"] == 0.005


def test_an_algorithms_section_sits_between_the_shared_keys_and_the_flags(tmp_path):
    from pfl_cli.config import load_config_file
    from pfl_cli.errors import ConfigError

    recipe = tmp_path / "r.yaml"
    recipe.write_text("train:\n  algorithm: pefll\n  lr: 0.05\n  rounds: 7\n  pefll:\n    embedding: linear\n"
                      "  fedavg:\n    lr: 0.005\n    server-lr: 1\n  ld-fedavg:\n    subspace_dim: 9\n")
    values = load_config_file(recipe, "train")
    pefll = registry.resolve_train_config(file_values=values)
    assert (pefll.algorithm, pefll.lr, pefll.rounds, pefll.embedding) == ("pefll", 0.05, 7, "linear")
    fedavg = registry.resolve_train_config(file_values=values, overrides={"algorithm": "fedavg"})
    assert (fedavg.lr, fedavg.server_lr, fedavg.rounds) == (0.005, 1.0, 7)  # its section over the shared lr
    flag = registry.resolve_train_config(file_values=values, flag_values={"algorithm": "fedavg", "lr": 0.1})
    assert flag.lr == 0.1  # a flag over the section
    assert registry.resolve_train_config(file_values=values, overrides={"algorithm": "ld-fedavg"}).subspace_dim == 9
    local = registry.resolve_train_config(file_values=values, overrides={"algorithm": "local"})
    assert local.lr == 0.05  # no section of its own: the shared keys
    recipe.write_text("train:\n  fedavg:\n    embedding: mlp\n")
    with pytest.raises(ConfigError, match="unknown config file key 'embedding' for algorithm 'fedavg'"):
        registry.resolve_train_config(file_values=load_config_file(recipe, "train"), overrides={"algorithm": "fedavg"})
    recipe.write_text("train:\n  algorithm: fedavg\n  embedding: mlp\n")  # a shared key one of them lacks
    with pytest.raises(ConfigError, match="under train: pefll:"):
        registry.resolve_train_config(file_values=load_config_file(recipe, "train"))
