"""Benchmark: PeFLL's CIFAR-10 paper configuration end to end, on synthetic CIFAR-shaped data of the real size.

Runs ``recipes/pefll/cifar10-100-clients.yaml`` unchanged (100 clients with 2 classes each, 10 of
them unseen; LeNet clients, CNN embedding, hypernetwork M; 5000 rounds x 5 clients x 50 local
SGD steps) with an evaluation every ``--eval-every`` rounds (50, issue 16), through the real
``pflx partition`` and ``pflx train`` commands, on 50,000 + 10,000 synthetic 3x32x32 uint8
images in 10 classes written in the published python-pickle layout of CIFAR-10 (each class a
smooth random pattern plus noise; nothing is downloaded). Prints the wall time of ``train``,
rounds per second and the peak GPU memory.

Target (issue 16): the whole 5000-round run in under 5 minutes on one H100. It is checked only
for a full run on CUDA (no extrapolation from a shorter run); other runs print their figures
beside "n/a". On CPU this is a smoke run: ``--rounds 2 --eval-every 1 --images 5000``.

    python benchmarks/pefll_paper_run.py [--device cuda] [--rounds 5000] [--eval-every 50]
                                         [--images 50000] [--out DIR]
"""

from __future__ import annotations

import argparse
import pickle
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from verdict import Verdicts

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "pefll" / "cifar10-100-clients.yaml"
PAPER_ROUNDS, TARGET_S = 5000, 300.0


def write_synthetic_cifar10(root: Path, train_images: int, test_images: int, seed: int = 0) -> Path:
    """CIFAR-10's python layout (five data batches, a test batch, batches.meta) of synthetic images."""
    rng = np.random.default_rng(seed)
    d = root / "cifar-10-batches-py"
    d.mkdir(parents=True, exist_ok=True)
    # One smooth pattern per class: 8x8x3 noise upsampled to 32x32, so classes are learnable.
    means = np.repeat(np.repeat(rng.uniform(40, 215, size=(10, 3, 8, 8)), 4, axis=2), 4, axis=3)

    def batch(n, label_name):
        labels = rng.integers(0, 10, size=n)
        x = means[labels] + rng.normal(0, 40, size=(n, 3, 32, 32))
        data = np.clip(x, 0, 255).astype(np.uint8).reshape(n, 3072)
        return {b"batch_label": label_name, b"labels": labels.tolist(), b"data": data,
                b"filenames": [b"synthetic.png"] * n}

    per = train_images // 5
    for i in range(1, 6):
        with open(d / f"data_batch_{i}", "wb") as fh:
            pickle.dump(batch(per, b"training batch"), fh, protocol=2)
    with open(d / "test_batch", "wb") as fh:
        pickle.dump(batch(test_images, b"testing batch"), fh, protocol=2)
    names = [b"airplane", b"automobile", b"bird", b"cat", b"deer", b"dog", b"frog", b"horse", b"ship", b"truck"]
    with open(d / "batches.meta", "wb") as fh:
        pickle.dump({b"label_names": names, b"num_cases_per_batch": per, b"num_vis": 3072}, fh, protocol=2)
    return d


def timed_pflx(argv: list[str], device: str) -> tuple[int, float, str, float]:
    """Run one pflx command in-process: (exit code, wall seconds, device name, peak GPU memory in GiB or NaN)."""
    import torch

    from pfl_cli.cli.app import main as pflx

    cuda = torch.cuda.is_available() and device in ("auto", "cuda") or device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    code = pflx(argv)
    wall = time.perf_counter() - t0
    name = torch.cuda.get_device_name() if cuda else "CPU"
    return code, wall, name, torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan")


def main(argv=None) -> int:
    from pfl_cli.cli.app import main as pflx

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="auto")
    p.add_argument("--rounds", type=int, default=PAPER_ROUNDS)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--images", type=int, default=50_000, help="train images (the test pool has a fifth of that)")
    p.add_argument("--out", type=Path, default=None, help="keep the data and artifacts here (default: a temp dir)")
    args = p.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        t0 = time.perf_counter()
        data = write_synthetic_cifar10(out / "data", args.images, args.images // 5)
        made = time.perf_counter() - t0
        code = pflx(["partition", "--config", str(RECIPE), "--dataset", f"cifar10:{data}", "--out",
                     str(out / "part"), "--force", "--format", "quiet"])
        if code:
            return code
        code, wall, device, memory = timed_pflx(
            ["train", "--config", str(RECIPE), "--partition", str(out / "part"), "--out", str(out / "train"),
             "--force", "--format", "quiet", "--set", f"rounds={args.rounds}",
             "--set", f"eval_every={args.eval_every}", "--set", f"device={args.device}"], args.device)
        if code:
            return code
        cuda = device != "CPU"

    print(f"PeFLL paper configuration ({RECIPE.relative_to(ROOT)}), {args.rounds} rounds, evaluation every "
          f"{args.eval_every}, {args.images:,} + {args.images // 5:,} synthetic 3x32x32 images, on {device}")
    v = Verdicts()
    v.note("synthetic data written", f"{made:.1f} s")
    v.note("train rounds per second", f"{args.rounds / wall:.2f}")
    v.note("peak GPU memory", "n/a (CPU)" if not cuda else f"{memory:.2f} GiB")
    full = cuda and args.rounds == PAPER_ROUNDS and args.images == 50_000
    if full:
        v.check("train wall time, whole paper run", f"{wall:.1f} s", f"< {TARGET_S:.0f} s on one H100", wall < TARGET_S)
    else:
        v.note("train wall time", f"{wall:.1f} s (target n/a: only a full {PAPER_ROUNDS}-round run on CUDA)")
    return v.finish()


if __name__ == "__main__":
    sys.exit(main())
