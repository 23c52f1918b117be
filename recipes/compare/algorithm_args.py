"""Print the `--set key=value` flags a recipe's `compare:` section gives one algorithm (for the Makefile)."""

import shlex
import sys

import yaml


def main(recipe: str, algorithm: str) -> str:
    with open(recipe) as fh:
        doc = yaml.safe_load(fh) or {}
    keys = (doc.get("compare") or {}).get(algorithm) or {}
    return " ".join(f"--set {shlex.quote(f'{k}={_yaml(v)}')}" for k, v in keys.items())


def _yaml(value) -> str:
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


if __name__ == "__main__":
    print(main(*sys.argv[1:3]))
