import sys, pathlib
sys.path.insert(0, "/work/main/benchmarks")
import conformance_fluke as cf
import torch
from fluke.algorithms import fedamp
orig = fedamp.FedAMPServer.aggregate
def agg(self, eligible, client_models):
    client_models = list(client_models)
    flat = torch.stack([torch.cat([p.data.view(-1) for p in m.parameters()]) for m in client_models])
    d2 = torch.cdist(flat, flat) ** 2
    print("round d2 offdiag min/median", round(d2[d2 > 0].min().item(), 3), round(d2[d2 > 0].median().item(), 3),
          "xi_ii of client 0:", round(1 - (self.hyper_params.alpha * torch.exp(-d2[0, 1:] / self.hyper_params.sigma) / self.hyper_params.sigma).sum().item(), 3), file=sys.stderr)
    return orig(self, eligible, client_models)
fedamp.FedAMPServer.aggregate = agg
args = type("A", (), dict(algorithm="fedamp", join=1.0, seed=0, rounds=3, work="/tmp/e-fedexp-work"))()
print(cf.child(args, pathlib.Path("/tmp/e-fedexp-work/dataset/pflxexport"), 10, 0.05))
