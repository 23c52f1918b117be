"""pflx's algorithms on Flower's deployment engine (``pip install "pflx[flower]"``, flwr 1.42).

``pflx flower app --config RECIPE.yaml --partition PART --out APPDIR`` writes a Flower app
(``pfl_cli.cli.flower_app_files``) whose ServerApp (:mod:`.server`) runs the algorithm's server side
and whose ClientApp (:mod:`.node`) runs its client side on the one client a SuperNode holds (its node
config names a pflx partition and a partition id). The ServerApp then writes a normal ``train``
artifact (``pfl_cli.cli.flower.write_deployment``: the cli layer writes artifacts). Only the algorithms in :data:`SUPPORTED` run there; :func:`check_deployable` refuses
the rest, and options the deployment does not implement, in one line.

The messages carry exactly the tensors the algorithm's traffic ledger counts (the global model
down, each client's model up); their bytes on the wire are measured and written beside the
ledger's count.
"""

from __future__ import annotations

from pfl_cli.errors import ConfigError

# Algorithms whose round is "global model down, local SGD, client model up, weighted mean"
# (thesis Alg. 3/4; FedProx adds its proximal term to the local objective).
SUPPORTED = ("fedavg", "fedprox")


def check_deployable(cfg) -> None:
    """Refuse, in one line, what the Flower deployment does not run (before anything is written)."""
    from pfl_cli.fl.api import validate_train_config

    if cfg.algorithm not in SUPPORTED:
        raise ConfigError(f"flower app: algorithm must be one of {', '.join(SUPPORTED)} (what runs on Flower so "
                          f"far); got {cfg.algorithm!r}.")
    validate_train_config(cfg)
    rules = (
        (cfg.dp_epsilon is not None, "dp: --dp is not deployed on Flower yet (DP-FedAvg with server-side noise "
                                     "is not implemented); drop --dp"),
        (cfg.val_fraction != 0, f"val_fraction must be 0 on Flower (the deployment keeps the last round's model, "
                                f"it does not select by validation); got {cfg.val_fraction}; add "
                                "--set val_fraction=0"),
        (cfg.finetune_steps != 0, f"finetune_steps must be 0 on Flower (new clients get the global model); got "
                                  f"{cfg.finetune_steps}"),
        (cfg.local_epochs is not None, f"local_epochs is not deployed on Flower; use local_steps; got "
                                       f"{cfg.local_epochs}"),
    )
    for broken, message in rules:
        if broken:
            raise ConfigError(f"flower app: {message}.")
