"""The simulation engine: client store, cohort batches, vectorized local SGD, evaluation, round loop."""

from pfl_cli.fl.api import PredictRun, TrainRun, predict_clients, train_federated, validate_train_config
from pfl_cli.fl.config import PredictConfig, TrainConfig

__all__ = ["PredictConfig", "PredictRun", "TrainConfig", "TrainRun", "predict_clients", "train_federated",
           "validate_train_config"]
