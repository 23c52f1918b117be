"""MDM hyperparameter study (thesis §3.4.2, Figure 3.6) at CPU scale: FedAvg on true vs simulated clients.

For every (lr, local_epochs, batch_size) of the recipe's grid and every client source -- the true
clients, and clients simulated by ``pflx simulate`` in the modes ``mdm``, ``iid`` and
``conditional-iid`` -- FedAvg trains on that source's clients (``pflx train``) and its global model
is scored on the true clients' test data (``pflx predict --clients all``). Writes ``results.csv``
(setting, source, accuracy), ``summary.json`` (mean |acc(source) - acc(true)| per mode) and
``hp.png`` (accuracy per setting, one line per source) under ``--out`` and prints the summary beside
the thesis's headline. Every stage runs through pflx's CLI, so each run is an artifact under --out.

    python recipes/mdm/hp-tuning/hp_tuning.py --out runs/hp-digits
    python recipes/mdm/hp-tuning/hp_tuning.py --out runs/hp-leaf --source leaf-fixture
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
from pathlib import Path

import numpy as np
import yaml

from pfl_cli.cli.app import main as pflx
from pfl_cli.data import load_dataset

RECIPE = Path(__file__).with_name("hp-tuning.yaml")
MODES = ("mdm", "iid", "conditional-iid")
SOURCES = ("true", *MODES)
THESIS = {"FEMNIST": {"mdm": 1.6, "iid": 3.3}, "CIFAR10": {"mdm": 0.8, "iid": 6.6}}


def run(*args) -> None:
    code = pflx([str(a) for a in args] + ["--format", "quiet"])
    if code != 0:
        raise SystemExit(f"hp_tuning.py: `pflx {' '.join(map(str, args))}` exited {code}.")


def digits_with_test_pool(out: Path, seed: int) -> str:
    """builtin:digits as npz with a stratified 30% official test pool (pool = 1)."""
    ds = load_dataset("builtin:digits")
    rng = np.random.default_rng(seed)
    pool = np.zeros(len(ds.y), dtype=np.uint8)
    for c in range(ds.num_classes):
        idx = rng.permutation(np.flatnonzero(ds.y == c))
        pool[idx[: int(round(0.3 * len(idx)))]] = 1
    path = out / "data" / "digits-pooled.npz"
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, x=ds.x, y=ds.y, pool=pool)
    return f"npz:{path.resolve()}"


def leaf_fixture(out: Path, seed: int, writers: int = 30) -> str:
    """A FEMNIST-layout LEAF dataset (train/ and test/ JSON) of digits written by ``writers`` users.

    Each writer has its own label mix (Dirichlet 0.5 over the 10 digits) and its own style (stroke
    intensity and offset), so clients differ in labels and in features, as FEMNIST's writers do.
    Images are the 8x8 digits upscaled to 24x24 and padded to 28x28, in [0, 1].
    """
    ds = load_dataset("builtin:digits")
    rng = np.random.default_rng(seed)
    images = np.kron(ds.x.reshape(-1, 8, 8) / 16.0, np.ones((3, 3)))
    images = np.pad(images, ((0, 0), (2, 2), (2, 2)))
    by_class = [rng.permutation(np.flatnonzero(ds.y == c)).tolist() for c in range(10)]
    pools = {"train": {}, "test": {}}
    for w in range(writers):
        mix = rng.dirichlet(np.full(10, 0.5))
        gain, shift = rng.uniform(0.6, 1.0), rng.uniform(0.0, 0.2)
        for pool, n in (("train", 40), ("test", 12)):
            xs, ys = [], []
            for c in rng.choice(10, size=n, p=mix):
                if not by_class[c]:
                    continue
                i = by_class[c].pop()
                xs.append(np.clip(gain * images[i] + shift, 0, 1).round(4).ravel().tolist())
                ys.append(int(c))
            pools[pool][f"w{w:03d}"] = (xs, ys)
    root = out / "data" / "leaf"
    for pool, users in pools.items():
        doc = {"users": list(users), "num_samples": [len(y) for _, y in users.values()],
               "user_data": {u: {"x": x, "y": y} for u, (x, y) in users.items()}}
        (root / pool).mkdir(parents=True, exist_ok=True)
        (root / pool / f"all_{pool}.json").write_text(json.dumps(doc))
    return f"leaf:{root.resolve()}?task=femnist"


def prepare(out: Path, source: str, recipe: Path, seed: int) -> tuple[str, Path]:
    """The true clients' partition and the three simulated partitions; returns (dataset spec, true dir)."""
    true = out / "true"
    if source == "digits":
        spec = digits_with_test_pool(out, seed)
        run("partition", "--config", recipe, "--dataset", spec, "--out", true, "--seed", seed)
    else:
        spec = leaf_fixture(out, seed)
        run("partition", "--dataset", spec, "--natural-id", "--out", true, "--seed", seed)
    stats = json.loads((true / "stats.json").read_text())
    n = int(stats.get("num_train_clients", stats.get("num_clients")))
    run("mdm-fit", "--config", recipe, "--partition", true, "--out", out / "mdm", "--seed", seed)
    run("simulate", "--model", out / "mdm", "--dataset", spec, "--num-clients", n, "--out", out / "sim-mdm",
        "--seed", seed)
    run("simulate", "--mode", "iid", "--like", true, "--num-clients", n, "--dataset", spec, "--out",
        out / "sim-iid", "--seed", seed)
    run("simulate", "--mode", "conditional-iid", "--like", true, "--dataset", spec, "--out",
        out / "sim-conditional-iid", "--seed", seed)
    return spec, true


def grid(recipe: Path) -> list[dict]:
    g = yaml.safe_load(recipe.read_text())["grid"]
    keys = list(g)
    return [dict(zip(keys, values)) for values in itertools.product(*(g[k] for k in keys))]


def accuracy(out: Path, source: str, i: int, setting: dict, true: Path, recipe: Path, arch: list, seed: int) -> float:
    part = true if source == "true" else out / f"sim-{source}"
    model, scored = out / "runs" / f"{source}-{i}", out / "runs" / f"{source}-{i}-on-true"
    run("train", "--config", recipe, "--partition", part, "--out", model, "--seed", seed, *arch,
        "--lr", setting["lr"], "--local-epochs", setting["local_epochs"], "--batch-size", setting["batch_size"])
    run("predict", "--model", model, "--partition", true, "--clients", "all", "--out", scored, "--seed", seed)
    return float(json.loads((scored / "metrics.json").read_text())["pooled_accuracy_nolm"])


def summarize(rows: list[dict], settings: list[dict]) -> dict:
    acc = {(r["setting"], r["source"]): r["accuracy"] for r in rows}
    out = {}
    for mode in MODES:
        diffs = [abs(acc[(i, mode)] - acc[(i, "true")]) for i in range(len(settings))]
        out[mode] = {"mean_abs_diff": float(np.mean(diffs)), "max_abs_diff": float(np.max(diffs))}
    return out


def plot(rows: list[dict], settings: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    style = {"true": ("green", ":", "true clients"), "mdm": ("red", "-", "MDM simulated"),
             "iid": ("blue", "-", "fully IID simulated"), "conditional-iid": ("orange", "--", "conditionally IID")}
    fig, ax = plt.subplots(figsize=(max(6, 0.55 * len(settings)), 4))
    x = np.arange(len(settings))
    for source in SOURCES:
        color, ls, label = style[source]
        y = [next(r["accuracy"] for r in rows if r["setting"] == i and r["source"] == source) for i in x]
        ax.plot(x, 100 * np.array(y), color=color, linestyle=ls, marker="o", label=label)
    ax.set_xticks(x, [f"lr={s['lr']}\nE={s['local_epochs']}\nB={s['batch_size']}" for s in settings], fontsize=7)
    ax.set_ylabel("test accuracy on the true clients (%)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("runs/hp-tuning"))
    ap.add_argument("--source", choices=("digits", "leaf-fixture"), default="digits")
    ap.add_argument("--recipe", type=Path, default=RECIPE)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    _, true = prepare(out, args.source, args.recipe, args.seed)
    settings = grid(args.recipe)
    arch = ["--model-arch", "mlp"]  # the LEAF fixture's 28x28 images too: an MLP keeps the grid to minutes on CPU
    rows = []
    for i, setting in enumerate(settings):
        for source in SOURCES:
            acc = accuracy(out, source, i, setting, true, args.recipe, arch, args.seed)
            rows.append({"setting": i, **setting, "source": source, "accuracy": acc})
            print(f"setting {i} {setting} {source}: {100 * acc:.1f}%", flush=True)
    with open(out / "results.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    summary = summarize(rows, settings)
    (out / "summary.json").write_text(json.dumps({"source": args.source, "settings": settings,
                                                  "modes": summary, "thesis": THESIS}, indent=2))
    plot(rows, settings, out / "hp.png", f"FedAvg on {args.source}: true vs simulated clients ({len(settings)} settings)")
    print(f"\nmean |acc(sim) - acc(true)| over {len(settings)} settings ({args.source}):")
    print("| simulation | ours (mean / max, points) | thesis FEMNIST | thesis CIFAR10 |")
    print("|---|---|---|---|")
    for mode in MODES:
        s = summary[mode]
        thesis = [f"{THESIS[d][mode]}" if mode in THESIS[d] else "-" for d in ("FEMNIST", "CIFAR10")]
        print(f"| {mode} | {100 * s['mean_abs_diff']:.2f} / {100 * s['max_abs_diff']:.2f} | {thesis[0]} | {thesis[1]} |")
    print(f"\nwrote {out / 'results.csv'}, {out / 'summary.json'}, {out / 'hp.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
