"""What the ServerApp and the ClientApp both read: the run's train config and the message names."""

from __future__ import annotations

import json

# Flower message types ("<category>.<action>"): the handshake, one training round, the final evaluation.
HELLO = "query.pflx_hello"
ROUND = "train.pflx_round"
EVALUATE = "evaluate.pflx_final"


def train_config(run_config) -> "object":
    """The resolved train config the app was written with (run config key ``pflx-config``, JSON), as its
    algorithm's own config class (:mod:`pfl_cli.registry`)."""
    from pfl_cli.registry import train_config as algorithm_config

    return algorithm_config(**json.loads(str(run_config["pflx-config"])))
