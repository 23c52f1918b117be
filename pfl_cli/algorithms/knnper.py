"""kNN-Per (Marfoq, Neglia, Vidal, Kameni, Vidal, ICML 2022): a global model plus a local kNN memory.

Training is FedAvg. A client, seen or new, builds a datastore of (phi(x), y) over its own
train data, phi being the global model's representation (the input of its last layer),
with one forward pass; a test point's prediction interpolates (Eq. 4)

    p(y | x) = lambda p_kNN(y | x) + (1 - lambda) p_global(y | x),
    p_kNN(y | x) proportional to sum over the k nearest x_j of 1[y_j = y] exp(-d(phi(x), phi(x_j)) / T)

with d the Euclidean distance, lambda = ``interpolation``, k = ``knn_k`` and T = ``knn_scale``
(the PeFLL thesis's baseline used scale 100, App. B.1.2). The search is batched: all test points of a chunk of
clients against their own datastores in one ``vmap``'d distance matrix and ``topk``.
No optimizer step at prediction; no private state (the datastore is rebuilt from the
client's data). Interpolation 0 is the global model. Not done: the paper's per-client
cross-validation of k and lambda (one k and lambda for all clients here).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pfl_cli.algorithms.base import require_features
from pfl_cli.algorithms.fedavg import FedAvg, FedAvgRoundConfig
from pfl_cli.fl.config import key
from pfl_cli.fl.params import stack


PREFIX = "net."


@dataclass(frozen=True)
class KNNPerConfig(FedAvgRoundConfig):
    """kNN-Per's keys: FedAvg's round and the kNN memory."""

    algorithm: str = key("knnper", "the algorithm these keys configure")
    knn_k: int = key(10, "neighbours k", "thesis §4.4, App. B.1.2: k in {5, 10}")
    knn_scale: float = key(100.0, "distance scale T of exp(-d / T)", "thesis §4.4, App. B.1.2: scale 100")
    interpolation: float = key(0.5, "weight lambda of the kNN distribution (0 = the global model)",
                               "thesis §4.4, App. B.1.2: per-client CV over {0.0, ..., 1.0}; 0.5 the grid's middle")


class KNNPer(FedAvg):
    name = "knnper"
    averages_updates = True  # FedAvg.aggregate: an update attack and a robust aggregator act there (issue 48)
    individual_reads = ""  # runs under --secagg: FedAvg's aggregate_secure (pfl_cli.fl.secagg)
    search_space = {"lr": "log:1e-3:1", "interpolation": "float:0:1", "knn_k": "int:1:50"}
    search_space_source = ("Marfoq et al., kNN-Per (ICML 2022), §5: the interpolation lambda and k chosen on "
                           "validation data")
    tune_group = "train"
    paper = "kNN-Per: Marfoq et al., ICML 2022"
    new_client_protocol = "the global model plus a kNN memory of its own data, one forward pass"
    config = KNNPerConfig
    dp_unit = None  # no DP variant: its prediction reads each client's own datastore

    def build(self) -> None:
        from pfl_cli.models.util import FeatureView
        from pfl_cli.algorithms.knnper_net import KNNPerNet

        super().build()
        require_features(self, "kNN-Per's datastore")
        self.personalized = True
        cfg = self.cfg
        self.knn_net = KNNPerNet(self.net, cfg.knn_k, cfg.knn_scale, cfg.interpolation)
        self.feature_net = FeatureView(self.net)

    @property
    def predict_net(self):
        return self.knn_net

    def personalize(self, clients: np.ndarray, gen):
        """The global model and each client's datastore: one forward pass over its train data."""
        import torch

        from pfl_cli.fl.distributed import split_cohort

        sel = torch.as_tensor(np.asarray(clients, dtype=np.int64), device=self.device)
        index, length = self.store.fit.rows(sel)
        params = {PREFIX + k: v for k, v in self.global_params.items()}
        out = stack(params, len(sel))
        out.update(split_cohort(self._datastores, self.store, index, {"index": index, "length": length}, params=params))
        return out, True

    def _datastores(self, index, length, params) -> dict:
        """Each client's memory: features and one-hot labels of its fit samples (rows of ``index``)."""
        import torch

        from torch.func import functional_call

        store = self.store
        valid = torch.arange(index.shape[1], device=self.device)[None, :] < length[:, None]
        with torch.no_grad():
            x = store.inputs(index)
            feats = functional_call(self.feature_net, params, (x.flatten(0, 1),))
            feats = feats.view(*index.shape, feats.shape[-1])
        return {"memory": feats, "memory_y": store.onehot(index) * valid[..., None],
                "memory_valid": valid.to(feats.dtype)}
