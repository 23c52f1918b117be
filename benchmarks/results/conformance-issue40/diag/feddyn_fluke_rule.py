"""FedDyn on the conformance task (ring, 20 clients, 50 rounds, seeds 0-2): pflx as is (Alg. 1), and pflx with fluke's
state rule (fluke-fl 0.8.1 algorithms/feddyn.py: the client state s_k += alpha (theta^{t-1} - theta_k), the local
gradient + alpha s_k beside the proximal alpha (theta - theta^{t-1}), the server model mean_P theta_k + mean_P s_k over
the cohort only). One-off diagnosis of the fluke quarter-cohort row's +6.27."""
import sys, tempfile, pathlib
sys.path.insert(0, "/work/main/benchmarks"); sys.path.insert(0, "/work/main")
import conformance as c
from pfl_cli.algorithms import feddyn as fd
from pfl_cli.fl.control_variates import uniform_mean
from pfl_cli.fl.api import train_federated

def fluke_round(self, t, cohort, gen):
    alpha = float(self.cfg.alpha)
    s = self.drift.gather(cohort)
    theta, loss, _ = self.corrected_sgd(cohort, gen, {k: alpha * v for k, v in s.items()}, prox_mu=alpha)
    self.record_exchange(self.global_params, theta, len(cohort))
    moved = {k: theta[k] - g for k, g in self.global_params.items()}
    new = {k: s[k] - alpha * moved[k] for k in moved}
    self.drift.scatter(cohort, new)
    mean = uniform_mean(theta)
    self.global_params = {k: mean[k] + new[k].mean(0) for k in mean}
    return loss

with tempfile.TemporaryDirectory() as tmp:
    work = pathlib.Path(tmp)
    c._export(work, c.DEFAULT_DATASET, 20, 0)
    x, y, part = c.load_export(work)
    original = fd.FedDyn.run_round
    for variant in ("pflx", "fluke-rule"):
        fd.FedDyn.run_round = original if variant == "pflx" else fluke_round
        for cohort in (None, 5):
            accs = [100 * train_federated(x, y, 10, part, c._pflx_config("feddyn", 50, s, cohort, "fluke"))
                    .outcome.best.summaries()["train"]["pooled_accuracy"] for s in (0, 1, 2)]
            print(variant, "every client" if cohort is None else "a quarter", " ".join(f"{a:.2f}" for a in accs),
                  f"mean {sum(accs) / 3:.2f}", flush=True)
