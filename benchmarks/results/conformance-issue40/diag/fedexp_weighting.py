"""FedExP on the conformance task (ring, 20 clients, 50 rounds, every client, seeds 0-2): pflx as is, and pflx with
fluke's eta_g (uniform over the cohort, fedexp.py _compute_eta, eps 1e-4) stepping along the data-size-weighted mean
(fluke's server.py aggregate). One-off diagnosis of the fluke row's -2.7 points."""
import sys, tempfile, pathlib
sys.path.insert(0, "/work/main/benchmarks"); sys.path.insert(0, "/work/main")
import torch
import conformance as c
from pfl_cli.algorithms import fedexp as fx
from pfl_cli.fl.server_optim import extrapolation_step
from pfl_cli.fl.api import train_federated

def fluke_aggregate(self, t, cohort, theta):
    self.record_exchange(self.global_params, theta, len(cohort))
    size = self.store.fit.length[cohort].to(torch.float32)
    weight = size / size.sum()
    deltas = {k: theta[k] - g for k, g in self.global_params.items()}
    self.previous = self.global_params
    n = len(cohort)
    uniform = torch.full((n,), 1.0 / n)
    _, eta = extrapolation_step(self.global_params, deltas, uniform, eps=self.cfg.eps)  # fluke's eta
    mean = {k: torch.einsum("c,c...->...", weight, d) for k, d in deltas.items()}
    self.global_params = {k: self.global_params[k] + eta * d for k, d in mean.items()}
    self.server_eta.append(eta)

with tempfile.TemporaryDirectory() as tmp:
    work = pathlib.Path(tmp)
    c._export(work, c.DEFAULT_DATASET, 20, 0)
    x, y, part = c.load_export(work)
    for variant in ("pflx", "fluke-eta"):
        if variant == "fluke-eta":
            fx.FedExP.aggregate = fluke_aggregate
        accs, etas = [], []
        for seed in (0, 1, 2):
            run = train_federated(x, y, 10, part, c._pflx_config("fedexp", 50, seed, None, "fluke"))
            accs.append(100 * run.outcome.best.summaries()["train"]["pooled_accuracy"])
        print(variant, " ".join(f"{a:.2f}" for a in accs), f"mean {sum(accs)/3:.2f}", flush=True)
