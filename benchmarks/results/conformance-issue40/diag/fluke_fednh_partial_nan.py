import sys, pathlib
sys.path.insert(0, "/work/main/benchmarks")
import conformance_fluke as cf
import torch
from fluke.algorithms import fednh
orig = fednh.FedNHServer.aggregate
def agg(self, eligible, client_models):
    cl = torch.zeros(self.hyper_params.n_protos)
    for c in eligible:
        cl += c.count_by_class
    orig(self, eligible, client_models)
    print("classes the cohort lacks", (cl == 0).nonzero().flatten().tolist(), "NaN prototype rows",
          torch.isnan(self.model.prototypes.data).any(1).nonzero().flatten().tolist(), file=sys.stderr)
fednh.FedNHServer.aggregate = agg
args = type("A", (), dict(algorithm="fednh", join=0.25, seed=0, rounds=3, work="/tmp/e-fedexp-work"))()
print(cf.child(args, pathlib.Path("/tmp/e-fedexp-work/dataset/pflxexport"), 10, 0.05))
import numpy as np
ys = np.concatenate([y for _, y in cf.read_clients(pathlib.Path("/tmp/e-fedexp-work/dataset/pflxexport/test"))])
print("test samples of class 0:", int((ys == 0).sum()), "of", len(ys))
