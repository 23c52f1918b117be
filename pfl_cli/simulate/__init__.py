"""Simulated clients from server data: MDM, fully IID and conditionally IID (thesis §3.1, §3.4).

>>> import numpy as np
>>> from pfl_cli.mdm import MDMParams
>>> from pfl_cli.simulate import SimulateConfig, simulate_partition, validate_config
>>> model = MDMParams(np.array([1.0]), np.array([[0.5, 0.5]]), np.array([[1.0]]), np.array([10, 11]))
>>> cfg = validate_config(SimulateConfig(num_clients=5, test_fraction=0.0), has_model=True, like_clients=None, has_labels=True)
>>> part = simulate_partition(np.repeat([0, 1], 100), cfg, num_classes=2, model=model, rng=np.random.default_rng(0))
>>> part.train_sizes.tolist()
[10, 10, 10, 10, 10]
"""

from pfl_cli.simulate.api import MODES, SimulateConfig, simulate_partition, validate_config
from pfl_cli.simulate.draw import SHORTAGE_POLICIES, deal

__all__ = ["MODES", "SHORTAGE_POLICIES", "SimulateConfig", "deal", "simulate_partition", "validate_config"]
