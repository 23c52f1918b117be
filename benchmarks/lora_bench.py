"""Benchmark: a cohort's LoRA local steps in one batched call against a per-client peft loop (issue 46).

Batched (pflx): the cohort's adapters and classifiers stacked over one frozen BERT shared as buffers, every step
one call of :func:`pfl_cli.fl.cohort.local_sgd` (``cohort_exec=vmap``), which folds the cohort into the batch:
the base runs once on every client's rows and each client's adapters and classifier as one grouped matmul over its
rows (``pfl_cli/fl/cohort.py``, ``_folded_forward``). Also shown: the same step under plain ``vmap`` over
``functional_call`` (folding switched off), the path pflx took before. Loop (the usual way): one ``peft`` model per
client (``get_peft_model``, the classifier in ``modules_to_save``) and ``torch.optim.SGD``, each client's steps in
turn. All take the same number of steps of the same batch shape (LoRA r 8 on query and value, sequences with
padding), from models built before the clock starts; the figure is CPU seconds (``time.process_time``, one
thread), best of ``--repeats`` runs taken in turn, batched / loop, measured in one run.

Cases and targets. The small BERT (2 layers, 32 wide) at batch 8 x 16 tokens (128 tokens a client step: per-call
overhead dominates, which batching removes): <= 1/3. The large BERT (4 layers, 128 wide) at batch 16 x 32 tokens:
<= 1x (FLOP-bound on a CPU: batching can only not lose). The small BERT at batch 16 x 32 tokens (512 tokens a
client step) is kernel-bound on a CPU as well (measured: the loop's kernels, on one client's cache-sized
activations, cost about half the folded call's per client): <= 1x. Also memory against the cohort size (large case,
each size and path in its own process): the resident memory of the built setup (one backbone and the cohort's
adapters batched; a peft model, backbone included, per client in the loop) and the peak one step adds. The checkpoints are built here with ``save_pretrained`` (random weights); nothing downloads. Needs the peft
extra.

    python benchmarks/lora_bench.py [--cohort 10] [--steps 5] [--repeats 5] [--memory-cohorts 1,5,10,20]

Exits 1 when a ratio misses its target.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHAPES = {"small": (2, 32), "large": (4, 128)}  # layers, hidden
# name: (model, batch, tokens, target batched / loop)
CASES = {"small": ("small", 8, 16, 1 / 3), "large": ("large", 16, 32, 1.0), "small-512": ("small", 16, 32, 1.0)}
VOCAB, RANK, CLASSES = 64, 8, 2


def checkpoint(directory: Path, layers: int, hidden: int) -> Path:
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=max(2, hidden // 32), intermediate_size=4 * hidden,
                        max_position_embeddings=64, num_labels=CLASSES, pad_token_id=0)
    BertForSequenceClassification(config).save_pretrained(str(directory))
    return directory


def token_data(n: int, length: int, seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.integers(1, VOCAB, size=(n, length))
    lengths = rng.integers(length // 2, length + 1, size=n)
    x[np.arange(length)[None, :] >= lengths[:, None]] = 0  # padded
    return x, rng.integers(0, CLASSES, size=n)


def batched_setup(directory: Path, cohort: int, steps: int, batch: int, length: int, fold: bool = True):
    """(run, net): ``run()`` trains the cohort's adapters ``steps`` steps in pflx's batched path (``fold`` False:
    plain vmap, the cohort not folded into the batch)."""
    import torch

    from pfl_cli.fl.batches import draw_batches
    from pfl_cli.fl.cohort import local_sgd
    from pfl_cli.fl.store import build_store
    from pfl_cli.models import build
    from pfl_cli.models.hf_checkpoint import hf_spec
    from pfl_cli.models.lora import lora_spec
    from pfl_cli.partition import PartitionConfig, partition_labels
    from pfl_cli.rng import make_rng

    x, y = token_data(cohort * batch * (steps + 1) * 2, length)
    part = partition_labels(y, PartitionConfig(scheme="iid", num_clients=cohort, test_fraction=0.1),
                            num_classes=CLASSES, rng=make_rng(0, "bench"))
    store = build_store(x, y, CLASSES, part, val_fraction=0.0, rng=None, device="cpu", vocab_size=VOCAB)
    base = hf_spec(f"hf:{directory}", (length,), CLASSES, vocab=VOCAB)
    spec = lora_spec(base, build(base), targets="query,value", rank=RANK, alpha=RANK, dropout=0.0)
    net = build(spec)
    if not fold:
        net.cohort_fold = frozenset()  # no tensor may fold: the cohort runs under vmap
    params = {k: v.detach().unsqueeze(0).repeat(cohort, *[1] * v.dim()) for k, v in net.named_parameters()}
    clients = torch.arange(cohort)

    def run(seed: int = 0):
        batches = draw_batches(store.fit, clients, steps, batch, torch.Generator().manual_seed(seed))
        return local_sgd(net, params, store, batches, lr=0.05, cohort_exec="vmap")

    return run, net


def loop_setup(directory: Path, cohort: int, steps: int, batch: int, length: int):
    """``run()``: each client's peft model takes ``steps`` SGD steps in turn."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForSequenceClassification

    base = AutoModelForSequenceClassification.from_pretrained(str(directory), local_files_only=True,
                                                              num_labels=CLASSES, attn_implementation="eager")
    config = LoraConfig(r=RANK, lora_alpha=RANK, lora_dropout=0.0, target_modules=["query", "value"],
                        modules_to_save=["classifier"])
    models = [get_peft_model(copy.deepcopy(base), config).eval() for _ in range(cohort)]
    optimizers = [torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.05) for m in models]
    x, y = token_data(cohort * batch * steps, length, seed=1)
    x, y = torch.as_tensor(x).view(cohort, steps, batch, length), torch.as_tensor(y).view(cohort, steps, batch)

    def run(seed: int = 0):
        for i, (model, opt) in enumerate(zip(models, optimizers)):
            for s in range(steps):
                ids = x[i, s]
                logits = model(input_ids=ids, attention_mask=(ids != 0).long()).logits
                loss = torch.nn.functional.cross_entropy(logits, y[i, s])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()

    return run


def cpu_seconds(runs: dict, repeats: int) -> dict:
    """Best CPU seconds of each of ``runs`` over ``repeats``, taken in turn (one load spike hits one run, not one
    path)."""
    best = {name: float("inf") for name in runs}
    for run in runs.values():
        run(0)  # warm-up
    for r in range(repeats):
        for name, run in runs.items():
            start = time.process_time()
            run(r + 1)
            best[name] = min(best[name], time.process_time() - start)
    return best


def _status_mb(key: str) -> float:
    """A /proc/self/status figure (VmRSS, VmHWM) in MB (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(key)


def memory_child(directory: str, cohort: int, how: str) -> None:
    """Print the resident memory (MB) the built ``how`` setup for ``cohort`` clients of the large case adds over the
    process's after its imports, and the peak one step of it adds over that (the peak is reset after building,
    Linux's ``clear_refs`` 5)."""
    import torch  # noqa: F401 (imported before the baseline)
    import transformers  # noqa: F401
    import peft  # noqa: F401

    _, batch, length, _ = CASES["large"]
    start = _status_mb("VmRSS")
    shape = (Path(directory), cohort, 1, batch, length)
    run = batched_setup(*shape)[0] if how == "batched" else loop_setup(*shape)
    built = _status_mb("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current resident set
    run(0)
    peak = _status_mb("VmHWM")
    print(json.dumps({"built_mb": built - start, "step_mb": peak - built}))


def main() -> int:
    import torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cohort", type=int, default=10)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--memory-cohorts", default="1,5,10,20")
    p.add_argument("--memory-child", nargs=3, metavar=("DIR", "COHORT", "HOW"), help=argparse.SUPPRESS)
    p.add_argument("--skip-speed", action="store_true", help="memory only")
    args = p.parse_args()
    torch.set_num_threads(1)
    from pfl_cli.torchvision_compat import declare_torchvision_ops

    declare_torchvision_ops()  # transformers imports torchvision where it is installed (pfl_cli/torchvision_compat.py)
    if args.memory_child:
        memory_child(args.memory_child[0], int(args.memory_child[1]), args.memory_child[2])
        return 0
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()
    missed = []
    with tempfile.TemporaryDirectory(prefix="pflx-lora-bench-") as tmp:
        dirs = {name: checkpoint(Path(tmp) / name, *shape) for name, shape in SHAPES.items()}
        print(f"cohort {args.cohort}, {args.steps} steps, LoRA r {RANK} on query/value + classifier; CPU seconds, "
              f"one thread, best of {args.repeats}")
        for name, (model, batch, length, target) in ({} if args.skip_speed else CASES).items():
            layers, hidden = SHAPES[model]
            shape = (dirs[model], args.cohort, args.steps, batch, length)
            t = cpu_seconds({"batched": batched_setup(*shape)[0], "vmap": batched_setup(*shape, fold=False)[0],
                             "loop": loop_setup(*shape)}, args.repeats)
            ratio = t["batched"] / t["loop"]
            ok = ratio <= target
            missed += [] if ok else [name]
            print(f"  {name:9s} BERT {layers} layers x {hidden}, batch {batch} x {length} tokens: batched "
                  f"{t['batched']:.3f} s (unfolded vmap {t['vmap']:.3f} s), peft loop {t['loop']:.3f} s, ratio "
                  f"{ratio:.2f} (target <= {target:.2f}) {'ok' if ok else 'MISS'}")
        print("memory against the cohort size (large case, MB resident: the built setup over the imports, and what "
              "one step adds at its peak):")
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        for c in [int(v) for v in args.memory_cohorts.split(",") if v]:
            row = []
            for how in ("batched", "loop"):
                out = subprocess.run([sys.executable, __file__, "--memory-child", str(dirs["large"]), str(c), how],
                                     capture_output=True, text=True, env=env, check=True)
                got = json.loads(out.stdout.strip().splitlines()[-1])
                row.append(f"{how} built {got['built_mb']:6.1f}, step +{got['step_mb']:6.1f}")
            print(f"  cohort {c:3d}: " + "; ".join(row))
    if missed:
        print(f"missed: {', '.join(missed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
