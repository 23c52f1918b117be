"""pflx's algorithms on Flower's deployment engine (``pip install "pflx[flower]"``, flwr 1.42).

``pflx flower app --config RECIPE.yaml --partition PART --out APPDIR`` writes a Flower app
(``pfl_cli.cli.flower_app_files``) whose ServerApp (:mod:`.server`) runs the algorithm's server side
and whose ClientApp (:mod:`.node`) runs its client side on the one client a SuperNode holds (its node
config names a pflx partition and a partition id). The ServerApp then writes a normal ``train``
artifact (``pfl_cli.cli.flower.write_deployment``: the cli layer writes artifacts). Only the algorithms in :data:`SUPPORTED` run there; :func:`check_deployable` refuses
the rest, and options the deployment does not implement, in one line.

The messages carry exactly the tensors the algorithm's traffic ledger counts (FedAvg: the global
model down, each client's model up; PeFLL: Alg. 8's six messages per client, thesis §4.3 and
App. B.1.3; pFedHN: theta_i down, delta theta_i up); their bytes on the wire are measured and written beside the ledger's count.
Each algorithm's messages live in one module (:data:`ROUNDS`): its server side and its node side. Under
``--secagg`` the averaging algorithms' rounds run through Flower's SecAgg+ instead (:mod:`.secure`).
"""

from __future__ import annotations

from pfl_cli.errors import ConfigError

# The module of each deployed algorithm's messages: "averaging" for a round of "global model down,
# local SGD, client model up, weighted mean" (thesis Alg. 3/4; FedProx adds its proximal term to
# the local objective), "pefll" for PeFLL's split back-propagation (thesis Alg. 8) and Alg. 7's
# descriptor-to-model exchange for evaluation, "pfedhn" for pFedHN's generated model down and its
# delta up (Alg. 1; a new client's embedding fit by the same exchange).
ROUNDS = {"fedavg": "averaging", "fedprox": "averaging", "pefll": "pefll", "pfedhn": "pfedhn"}
SUPPORTED = tuple(ROUNDS)
# --dp on Flower: DP-FedAvg (McMahan et al. 2018), the averaging rounds with the server clipping each
# client's delta and adding the noise (FedAvg.aggregate), for the averaging algorithms that declare
# client-level DP (FedProx declares no DP variant: `pflx train --algorithm fedprox --dp` is refused too);
# the hypernetwork rounds have no DP variant here.


def private_algorithms() -> tuple[str, ...]:
    """The deployed algorithms ``--dp`` runs for: averaging rounds of an algorithm whose DP unit is the client."""
    from pfl_cli import registry

    return tuple(a for a, module in ROUNDS.items()
                 if module == "averaging" and registry.get(a).algorithm.dp_unit == "client")


def rounds_for(cfg):
    """The module of ``cfg.algorithm``'s messages: ``one_round``, ``evaluate`` (server side) and node handlers."""
    import importlib

    return importlib.import_module(f"{__name__}.{ROUNDS[cfg.algorithm]}")


def round_function(cfg):
    """The server side of one training round: the algorithm's own, or under ``--secagg`` Flower's SecAgg+
    (:func:`.secure.one_round`, the averaging algorithms)."""
    if getattr(cfg, "secagg", False):
        from pfl_cli.interop.flower_app.secure import one_round

        return one_round
    return rounds_for(cfg).one_round


def check_deployable(cfg) -> None:
    """Refuse, in one line, what the Flower deployment does not run (before anything is written)."""
    from pfl_cli.fl.api import validate_train_config

    if cfg.algorithm not in SUPPORTED:
        raise ConfigError(f"flower app: algorithm must be one of {', '.join(SUPPORTED)} (what runs on Flower so "
                          f"far); got {cfg.algorithm!r}.")
    own = {k: getattr(cfg, k, None) for k in ("finetune_steps", "local_epochs", "track_descriptors",
                                               "client_sizes", "sam_rho")}  # per algorithm
    private = private_algorithms()
    secagg = bool(getattr(cfg, "secagg", False))
    from pfl_cli.interop.flower_app.secure import max_bits

    rules = (
        (cfg.dp_epsilon is not None and cfg.algorithm not in private,
         f"dp: --dp runs on Flower for {', '.join(private)} (DP-FedAvg, the server adding the noise); got "
         f"{cfg.algorithm!r}"),
        (cfg.val_fraction != 0, f"val_fraction must be 0 on Flower (the deployment keeps the last round's model, "
                                f"it does not select by validation); got {cfg.val_fraction}; add "
                                "--set val_fraction=0"),
        (bool(own["finetune_steps"]), f"finetune_steps must be 0 on Flower (new clients get the global model); got "
                                      f"{own['finetune_steps']}"),
        (own["local_epochs"] is not None, f"local_epochs is not deployed on Flower; use local_steps; got "
                                          f"{own['local_epochs']}"),
        (bool(own["track_descriptors"]), "track_descriptors is not deployed on Flower (the server sees no label "
                                         "distributions); drop it"),
        (bool(own["client_sizes"]), f"client_sizes is not deployed on Flower (one model size per run); got "
                                    f"{own['client_sizes']!r}; drop it"),
        (secagg and ROUNDS[cfg.algorithm] != "averaging",
         f"secagg runs on Flower's SecAgg+ for {', '.join(a for a, m in ROUNDS.items() if m == 'averaging')} (their "
         f"server needs the cohort's sums only); got {cfg.algorithm!r}"),
        (secagg and cfg.dp_epsilon is not None and cfg.dp_mechanism != "ddg",
         "secagg with --dp runs on Flower with the distributed mechanism only (each node adds its noise share "
         f"before SecAgg+); add --set dp_mechanism=ddg; got dp_mechanism {cfg.dp_mechanism!r}"),
        (secagg and cfg.dp_mechanism == "ddg" and cfg.clients_per_round is not None
         and cfg.dp_bits > max_bits(cfg.clients_per_round),
         f"dp_bits must be at most {max_bits(cfg.clients_per_round or 2)} on Flower (SecAgg+ sums integers below "
         f"2^32 and quantizes to int32) with a cohort of {cfg.clients_per_round}; got {cfg.dp_bits}"),
        (bool(own["sam_rho"]), f"sam_rho is not deployed on Flower (its nodes take plain SGD steps); got "
                               f"{own['sam_rho']!r}; drop it"),
        (cfg.attack != "none", f"attack simulates Byzantine clients, and a deployment's clients are real nodes; got "
                               f"{cfg.attack!r}; drop it"),
        (cfg.aggregator != "mean", f"aggregator is not deployed on Flower (its server takes FedAvg's mean); got "
                                   f"{cfg.aggregator!r}; drop it"),
    )
    for broken, message in rules:
        if broken:
            raise ConfigError(f"flower app: {message}.")
    from pfl_cli.fl.conditions.settings import set_conditions

    if set_conditions(cfg):  # a real deployment has its own availability, dropouts and links: none is simulated
        raise ConfigError(f"flower app: federation conditions ({', '.join(set_conditions(cfg))}) are simulated by "
                          "pflx train only; a Flower deployment's clients are really available or not. Drop them.")
    validate_train_config(cfg)  # after the deployment's own rules: what Flower cannot run is said first
