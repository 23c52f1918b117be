"""Benchmark: a cohort's LoRA local steps in one batched call against a per-client peft loop (issue 46).

Batched (pflx): the cohort's adapters and classifiers stacked, one frozen BERT shared as buffers, every step one
``vmap`` over ``functional_call`` (:func:`pfl_cli.fl.cohort.local_sgd`, ``cohort_exec=vmap``). Loop (the usual
way): one ``peft`` model per client (``get_peft_model``, the classifier in ``modules_to_save``) and
``torch.optim.SGD``, each client's steps in turn. Both take the same number of steps of the same batch shape
(LoRA r 8 on query and value, batch 16, 32 tokens with padding), from models built before the clock starts; the
figure is CPU seconds (``time.process_time``, one thread) batched / loop, measured in one run.

Targets: <= 1/3 on a 2-layer, 32-wide BERT (small: per-call overhead dominates, which batching removes) and
<= 1x on a 4-layer, 128-wide BERT. Also the peak memory of one batched step against the cohort size, each size in
its own process (peak resident set above the process's after building the net). The checkpoints are built here
with ``save_pretrained`` (random weights); nothing downloads. Needs the peft extra.

    python benchmarks/lora_bench.py [--cohort 10] [--steps 5] [--memory-cohorts 1,5,10,20]

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
TARGETS = {"small": 1 / 3, "large": 1.0}
VOCAB, LENGTH, BATCH, RANK, CLASSES = 64, 32, 16, 8, 2


def checkpoint(directory: Path, layers: int, hidden: int) -> Path:
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=max(2, hidden // 32), intermediate_size=4 * hidden,
                        max_position_embeddings=64, num_labels=CLASSES, pad_token_id=0)
    BertForSequenceClassification(config).save_pretrained(str(directory))
    return directory


def token_data(n: int, seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.integers(1, VOCAB, size=(n, LENGTH))
    lengths = rng.integers(LENGTH // 2, LENGTH + 1, size=n)
    x[np.arange(LENGTH)[None, :] >= lengths[:, None]] = 0  # padded
    return x, rng.integers(0, CLASSES, size=n)


def batched_setup(directory: Path, cohort: int, steps: int):
    """(run, net): ``run()`` trains the cohort's adapters ``steps`` steps in pflx's batched path."""
    import torch

    from pfl_cli.fl.batches import draw_batches
    from pfl_cli.fl.cohort import local_sgd
    from pfl_cli.fl.store import build_store
    from pfl_cli.models import build
    from pfl_cli.models.hf_checkpoint import hf_spec
    from pfl_cli.models.lora import lora_spec
    from pfl_cli.partition import PartitionConfig, partition_labels
    from pfl_cli.rng import make_rng

    x, y = token_data(cohort * BATCH * (steps + 1) * 2)
    part = partition_labels(y, PartitionConfig(scheme="iid", num_clients=cohort, test_fraction=0.1),
                            num_classes=CLASSES, rng=make_rng(0, "bench"))
    store = build_store(x, y, CLASSES, part, val_fraction=0.0, rng=None, device="cpu", vocab_size=VOCAB)
    base = hf_spec(f"hf:{directory}", (LENGTH,), CLASSES, vocab=VOCAB)
    spec = lora_spec(base, build(base), targets="query,value", rank=RANK, alpha=RANK, dropout=0.0)
    net = build(spec)
    params = {k: v.detach().unsqueeze(0).repeat(cohort, *[1] * v.dim()) for k, v in net.named_parameters()}
    clients = torch.arange(cohort)

    def run(seed: int = 0):
        batches = draw_batches(store.fit, clients, steps, BATCH, torch.Generator().manual_seed(seed))
        return local_sgd(net, params, store, batches, lr=0.05, cohort_exec="vmap")

    return run, net


def loop_setup(directory: Path, cohort: int, steps: int):
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
    x, y = token_data(cohort * BATCH * steps, seed=1)
    x, y = torch.as_tensor(x).view(cohort, steps, BATCH, LENGTH), torch.as_tensor(y).view(cohort, steps, BATCH)

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


def cpu_seconds(run, repeats: int) -> float:
    run(0)  # warm-up
    best = float("inf")
    for r in range(repeats):
        start = time.process_time()
        run(r + 1)
        best = min(best, time.process_time() - start)
    return best


def memory_child(directory: str, cohort: int) -> None:
    """Print the peak resident set (MB) one batched step adds over the built net, for ``cohort`` clients."""
    import resource

    run, _ = batched_setup(Path(directory), cohort, 1)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    run(0)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"cohort": cohort, "peak_mb": (after - before) / 1024}))


def main() -> int:
    import torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cohort", type=int, default=10)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--memory-cohorts", default="1,5,10,20")
    p.add_argument("--memory-child", nargs=2, metavar=("DIR", "COHORT"), help=argparse.SUPPRESS)
    p.add_argument("--skip-speed", action="store_true", help="memory only")
    args = p.parse_args()
    torch.set_num_threads(1)
    from pfl_cli.torchvision_compat import declare_torchvision_ops

    declare_torchvision_ops()  # transformers imports torchvision where it is installed (pfl_cli/torchvision_compat.py)
    if args.memory_child:
        memory_child(args.memory_child[0], int(args.memory_child[1]))
        return 0
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()
    missed = []
    with tempfile.TemporaryDirectory(prefix="pflx-lora-bench-") as tmp:
        dirs = {name: checkpoint(Path(tmp) / name, *shape) for name, shape in SHAPES.items()}
        print(f"cohort {args.cohort}, {args.steps} steps of batch {BATCH} x {LENGTH} tokens, LoRA r {RANK} on "
              "query/value + classifier; CPU seconds, one thread")
        for name, (layers, hidden) in ({} if args.skip_speed else SHAPES).items():
            batched, _ = batched_setup(dirs[name], args.cohort, args.steps)
            loop = loop_setup(dirs[name], args.cohort, args.steps)
            b, lp = cpu_seconds(batched, args.repeats), cpu_seconds(loop, args.repeats)
            ratio = b / lp
            ok = ratio <= TARGETS[name]
            missed += [] if ok else [name]
            print(f"  {name:5s} BERT {layers} layers x {hidden}: batched {b:.3f} s, peft loop {lp:.3f} s, "
                  f"ratio {ratio:.2f} (target <= {TARGETS[name]:.2f}) {'ok' if ok else 'MISS'}")
        print("peak memory of one batched step (small BERT) against the cohort size:")
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        for c in [int(v) for v in args.memory_cohorts.split(",") if v]:
            out = subprocess.run([sys.executable, __file__, "--memory-child", str(dirs["small"]), str(c)],
                                 capture_output=True, text=True, env=env, check=True)
            got = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"  cohort {c:3d}: {got['peak_mb']:.1f} MB")
    if missed:
        print(f"missed: {', '.join(missed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
