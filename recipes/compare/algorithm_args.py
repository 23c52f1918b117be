"""Print the `--set key=value` flags a comparison recipe gives one algorithm (for the Makefile).

Each algorithm owns its keys (`pflx algorithms NAME`), so the recipe's shared keys (top-level
scalars and the `train:` section) go to an algorithm only where it takes them; its `compare:`
entry is set on top, and a key there that the algorithm does not take is refused by `pflx train`.
"""

import shlex
import sys

import yaml

from pfl_cli import registry

SECTIONS = ("partition", "train", "predict", "compare", "paper")


def main(recipe: str, algorithm: str) -> str:
    with open(recipe) as fh:
        doc = yaml.safe_load(fh) or {}
    taken = set(registry.get(algorithm).keys)
    shared = {k: v for k, v in doc.items() if k not in SECTIONS and not isinstance(v, dict)}
    shared.update(doc.get("train") or {})
    keys = {k: v for k, v in shared.items() if k.replace("-", "_") in taken}
    keys.update((doc.get("compare") or {}).get(algorithm) or {})
    return " ".join(f"--set {shlex.quote(f'{k}={_yaml(v)}')}" for k, v in keys.items())


def _yaml(value) -> str:
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


if __name__ == "__main__":
    print(main(*sys.argv[1:3]))
