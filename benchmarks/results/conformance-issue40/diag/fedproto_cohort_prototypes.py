"""FedProto at a quarter cohort on the conformance task (ring, 20 clients, 5 a round, 50 rounds, seeds 0-2, the nearest
global prototype): pflx as is (a class no cohort client holds keeps its last prototype), and pflx with PFLlib's rule
(serverproto.py:45: the global prototypes are the last cohort's only). One-off diagnosis of the PFLlib row's +5.24."""
import sys, tempfile, pathlib
sys.path.insert(0, "/work/main/benchmarks"); sys.path.insert(0, "/work/main")
import torch
import conformance as c
from pfl_cli.algorithms import fedproto as fp
from pfl_cli.fl.api import train_federated

original = fp.merge_prototypes
def cohort_only(prototypes, seen, protos, counts):
    return original(torch.zeros_like(prototypes), torch.zeros_like(seen), protos, counts)

with tempfile.TemporaryDirectory() as tmp:
    work = pathlib.Path(tmp)
    c._export(work, c.DEFAULT_DATASET, 20, 0)
    x, y, part = c.load_export(work)
    for variant in ("pflx", "pfllib-rule"):
        fp.merge_prototypes = original if variant == "pflx" else cohort_only
        accs = [100 * train_federated(x, y, 10, part, c._pflx_config("fedproto", 50, s, 5))
                .outcome.best.summaries()["train"]["pooled_accuracy"] for s in (0, 1, 2)]
        print(variant, " ".join(f"{a:.2f}" for a in accs), f"mean {sum(accs) / 3:.2f}", flush=True)
