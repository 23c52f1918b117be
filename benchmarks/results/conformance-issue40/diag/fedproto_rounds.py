"""pflx FedProto on the conformance task: the pooled accuracy after R rounds (seed 0, every client), beside pflx's Local
with R epochs, and FedProto with lambda 0 (its clients then train their own models alone: Local's procedure)."""
import sys, tempfile, pathlib
sys.path.insert(0, "/work/main/benchmarks"); sys.path.insert(0, "/work/main")
import conformance as c
from pfl_cli.fl.api import train_federated
from pfl_cli.registry import train_config
with tempfile.TemporaryDirectory() as tmp:
    work = pathlib.Path(tmp); c._export(work, c.DEFAULT_DATASET, 20, 0); x, y, part = c.load_export(work)
    for R in [int(a) for a in sys.argv[1].split(",")]:
        acc = lambda cfg: 100 * train_federated(x, y, 10, part, cfg).outcome.best.summaries()["train"]["pooled_accuracy"]
        proto = acc(c._pflx_config("fedproto", R, 0))
        proto0 = acc(c._pflx_config("fedproto", R, 0).__class__(**{**c._pflx_config("fedproto", R, 0).__dict__, "fedproto_lambda": 0.0}))
        local = acc(c._pflx_config("local", R, 0))
        print(f"rounds {R}: fedproto {proto:.2f}  fedproto lambda 0 {proto0:.2f}  local {local:.2f}", flush=True)
