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
    """The entries of ``values`` whose key ``algorithm`` takes, where it acts: local_steps only where
    local_epochs (from ``values``, else the algorithm's default) is null (:func:`counts_steps`)."""
    keys = taken(algorithm)
    out = {k: v for k, v in values.items() if k in keys}
    if not counts_steps(algorithm, out.get("local_epochs", _default_epochs(algorithm))):
        out.pop("local_steps", None)
    return out


def _default_epochs(algorithm: str):
    return getattr(registry.get(algorithm).config(), "local_epochs", None)


def counts_steps(algorithm: str, local_epochs=None) -> bool:
    """Whether a round of ``algorithm`` counts local_steps at this ``local_epochs`` (a round of epochs counts
    none, and local_steps beside it is refused: pfl_cli.fl.config.NEEDS); False where it takes no local_steps."""
    return "local_steps" in taken(algorithm) and local_epochs in (None, "null", "None", "none", "~", "")


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
    if not counts_steps(algorithm, _epochs_of(args, algorithm)):
        keys = keys - {"local_steps"}  # a round of local_epochs epochs: --local-steps beside it is refused
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


def _epochs_of(args: list[str], algorithm: str):
    """The local_epochs ``pflx train`` arguments set (--local-epochs E, --set local_epochs=E), else the
    algorithm's default (a --config file's value is not read: a test passing one sets local_steps there)."""
    epochs = _default_epochs(algorithm)
    for i, a in enumerate(args[:-1]):
        if a == "--local-epochs":
            epochs = args[i + 1]
        if a == "--set" and args[i + 1].split("=", 1)[0].strip().replace("-", "_") == "local_epochs":
            epochs = args[i + 1].split("=", 1)[1].strip()
    return epochs


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


# --------------------------------------------------------------- smoke-size runs of any algorithm (issue 40)
# The --dp budget of a smoke run of an algorithm that declares ``dp_required`` (the local-DP ones): the budget
# of tests/cli/test_holdout_agreement.py, with seeded noise so that a resumed run is byte-identical.
LDP_SMOKE = ["--dp", "eps=4,delta=1e-5,clip=0.5,noise=seeded", "--set", "normalize=false",
             "--set", "dp_sampling_rate=0.25"]
# The backbone of a smoke run of an algorithm that runs only on one: random-weight micro, no weights file.
BACKBONE_SMOKE = ["--set", "backbone=resnet-micro"]


def smoke_values(algorithm: str) -> dict:
    """The algorithm's own epoch/step/round counts at 1 and widths at 8 (its keys beyond TrainConfig's), as
    tests/algorithms/test_no_ignored_key.py's ``small`` shrinks them."""
    import dataclasses

    from pfl_cli.fl.config import TrainConfig

    entry = registry.get(algorithm)
    defaults, common, out = entry.config(), {f.name for f in dataclasses.fields(TrainConfig)}, {}
    for f in dataclasses.fields(entry.config):
        value = getattr(defaults, f.name)
        if f.name in common or isinstance(value, bool) or not isinstance(value, int):
            continue
        if f.name.endswith(("_epochs", "_steps", "_rounds")) and value > 1:
            out[f.name] = 1
        elif f.name.endswith(("_hidden", "_dim")) and value > 8:
            out[f.name] = 8
    return out


def smoke_sets(algorithm: str) -> list[str]:
    """:func:`smoke_values` as ``--set key=value`` arguments."""
    return [a for k, v in smoke_values(algorithm).items() for a in ("--set", f"{k}={v}")]


def dp_sets(algorithm: str) -> list[str]:
    """:data:`LDP_SMOKE` where the algorithm declares ``dp_required``, else nothing."""
    return list(LDP_SMOKE) if registry.get(algorithm).algorithm.dp_required else []


_BACKBONE: dict = {}


def needs_backbone(algorithm: str) -> bool:
    """Whether the algorithm refuses to build its client net without a backbone (HyperFL-LPM): its
    ``resolve_arch`` asked on a tiny digits store, the refusal's words read."""
    if algorithm not in _BACKBONE:
        from pfl_cli.data import load_dataset
        from pfl_cli.errors import PflxError
        from pfl_cli.fl.store import build_store
        from pfl_cli.partition import PartitionConfig, partition_labels
        from pfl_cli.rng import make_rng

        ds = load_dataset("builtin:digits")
        part = partition_labels(ds.y, PartitionConfig(scheme="pathological", classes_per_client=2, num_clients=4,
                                                      test_fraction=0.3),
                                num_classes=ds.num_classes, rng=make_rng(0, "partition"), pool=ds.pool)
        store = build_store(ds.x, ds.y, ds.num_classes, part, val_fraction=0.0, rng=make_rng(0, "validation-split"),
                            device="cpu")
        try:
            registry.get(algorithm).algorithm.resolve_arch(registry.train_config(algorithm), store)
            _BACKBONE[algorithm] = False
        except PflxError as err:
            _BACKBONE[algorithm] = "backbone" in str(err)
    return _BACKBONE[algorithm]


def backbone_sets(algorithm: str) -> list[str]:
    """:data:`BACKBONE_SMOKE` where the algorithm runs only on a backbone, else nothing."""
    return list(BACKBONE_SMOKE) if needs_backbone(algorithm) else []
