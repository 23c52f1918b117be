"""What the ServerApp and the ClientApp both read: the run's train config and the message names."""

from __future__ import annotations

import json

# Flower message types ("<category>.<action>"): the handshake, one training round, the final evaluation.
HELLO = "query.pflx_hello"
ROUND = "train.pflx_round"
EVALUATE = "evaluate.pflx_final"


def train_config(run_config) -> "object":
    """The resolved ``TrainConfig`` the app was written with (run config key ``pflx-config``, JSON)."""
    from pfl_cli.fl.config import TrainConfig

    return TrainConfig(**json.loads(str(run_config["pflx-config"])))
