"""eta_g per round of FedExP in pflx and in fluke on the conformance task (seed 0, every client, 50 rounds)."""
import sys, pathlib, json, subprocess, os
work = pathlib.Path("/tmp/e-fedexp-work")
if sys.argv[1:] == ["fluke"]:
    sys.path.insert(0, "/work/main/benchmarks")
    import conformance_fluke as cf
    import fluke.algorithms.fedexp as fe
    etas = []
    orig = fe._compute_eta
    fe._compute_eta = lambda w, wi, eps=1e-4: etas.append(orig(w, wi, eps)) or etas[-1]
    args = type("A", (), dict(algorithm="fedexp", join=1.0, seed=0, rounds=50, work=str(work)))()
    acc = cf.child(args, work / "dataset" / "pflxexport", 10, 0.05)
    print(json.dumps({"acc": acc, "eta": etas}))
else:
    sys.path.insert(0, "/work/main/benchmarks"); sys.path.insert(0, "/work/main")
    import conformance as c
    from pfl_cli.fl.api import train_federated
    import shutil
    shutil.rmtree(work, ignore_errors=True); work.mkdir()
    c._export(work, c.DEFAULT_DATASET, 20, 0)
    c._write_initial_model(work, "fedexp", 50, 0, "fluke")
    x, y, part = c.load_export(work)
    run = train_federated(x, y, 10, part, c._pflx_config("fedexp", 50, 0, None, "fluke"))
    alg = run.algorithm if hasattr(run, "algorithm") else None
    print("pflx acc", run.outcome.best.summaries()["train"]["pooled_accuracy"])
    print("pflx eta", [round(e, 2) for e in getattr(alg, "server_eta", [])] if alg else "n/a")
    out = subprocess.run(["/work/peers/fluke-venv/bin/python", __file__, "fluke"], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": "/work/main/benchmarks"}, cwd="/tmp")
    res = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else out.stderr[-2000:]
    print("fluke acc", res["acc"] if isinstance(res, dict) else res)
    if isinstance(res, dict):
        print("fluke eta", [round(e, 2) for e in res["eta"]])
