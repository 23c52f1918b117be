"""Test helpers: small settings shared by runs of several algorithms, each given only the keys it takes.

Each algorithm owns its config and refuses keys it does not take (tested in
tests/cli/test_algorithm_configs.py); tests that shrink every algorithm with one set of keys
(``hyper_hidden=16`` for speed) pass them through these filters. Importable from any test module
(pytest puts ``tests/`` on ``sys.path`` for its rootdir conftest).
"""

from __future__ import annotations

from pfl_cli import registry

BOOLEAN_FLAGS = {"label_mask", "standardize_descriptor", "write_nonprivate"}


def taken(algorithm: str) -> set[str]:
    return set(registry.get(algorithm).keys)


def only_taken(algorithm: str, values: dict) -> dict:
    """The entries of ``values`` whose key ``algorithm`` takes."""
    keys = taken(algorithm)
    return {k: v for k, v in values.items() if k in keys}


def small_config(algorithm: str = "pefll", **values):
    """``registry.train_config(algorithm, ...)`` with the keys of ``values`` it takes (all of them are kept
    for :func:`replace` to hand on to another algorithm)."""
    cfg = registry.train_config(algorithm, **only_taken(algorithm, values))
    object.__setattr__(cfg, "_small_values", dict(values))  # frozen: set once, here
    return cfg


def cli_args(args, algorithm: str | None = None) -> list[str]:
    """``pflx train`` arguments without the keys ``algorithm`` (default: the one ``args`` names) does not take."""
    args = [str(a) for a in args]
    if algorithm is None:
        algorithm = "pefll"
        for i, a in enumerate(args[:-1]):
            if a == "--algorithm":
                algorithm = args[i + 1]
            if a == "--set" and args[i + 1].startswith("algorithm="):
                algorithm = args[i + 1].split("=", 1)[1]
    if algorithm not in registry.names():
        return args  # the command refuses it (the test's point)
    keys, every = taken(algorithm), {k for e in registry.entries().values() for k in e.keys}
    out, i = [], 0
    while i < len(args):
        a = args[i]
        if a == "--set" and i + 1 < len(args):
            key = args[i + 1].split("=", 1)[0].replace("-", "_")
            if key in keys or key not in every:
                out += [a, args[i + 1]]
            i += 2
            continue
        if a.startswith("--") and "=" not in a:
            name = a[2:].replace("-", "_")
            boolean = name.startswith("no_") or name in BOOLEAN_FLAGS
            key = name[3:] if name.startswith("no_") else name
            if key in every and key not in keys:
                i += 1 if boolean else 2
                continue
        out.append(a)
        i += 1
    return out


def _explicit(cfg) -> dict:
    return dict(cfg.__dict__.get("_small_values", {}))


def replace(cfg, **changes):
    """``dataclasses.replace`` for train configs that may change the algorithm: the new algorithm's config
    from the values the old one was built with (:func:`small_config`) and ``changes``, each where taken."""
    import dataclasses

    from pfl_cli.fl.config import TrainConfig

    if not isinstance(cfg, TrainConfig):
        return dataclasses.replace(cfg, **changes)
    values = {**_explicit(cfg), **changes}
    algorithm = values.pop("algorithm", cfg.algorithm)
    return small_config(algorithm, **values)
