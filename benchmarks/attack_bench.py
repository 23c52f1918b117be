"""Benchmark: 16 IG targets attacked as one batched optimization vs one at a time (``pflx attack``).

A LeNet (Table B.1) FedAvg gradient on 1x28x28 inputs, 100 IG iterations per target, same
initializations; the two give the same reconstructions (``tests/attack/test_attacks.py``).
Target: batching is not slower than the loop on the 2-core dev machine (speedup >= 1.0); on a
GPU the batched form is what keeps 50 images x 10,000 iterations in minutes.

    python benchmarks/attack_bench.py [--device cuda]
"""

from __future__ import annotations

import argparse
import sys
import time

TARGET_SPEEDUP = 1.0


def main() -> int:
    import torch

    from pfl_cli.attack.invert import invert_gradients
    from pfl_cli.fl.cohort import batch_gradients
    from pfl_cli.models import build, client_spec

    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--targets", type=int, default=16)
    parser.add_argument("--iterations", type=int, default=100)
    args = parser.parse_args([] if sys.argv[0].endswith("run.py") else None)  # under benchmarks/run.py: defaults
    device, n = torch.device(args.device), args.targets
    torch.manual_seed(0)
    net = build(client_spec("lenet", (1, 28, 28), 10, ())).to(device)
    params = {k: v.detach().unsqueeze(0).expand(n, *v.shape).clone() for k, v in net.named_parameters()}
    x = torch.rand(n, 1, 1, 28, 28, device=device)
    y = torch.randint(0, 10, (n, 1), device=device)

    def upload(xd, yd):
        return batch_gradients(net, {k: v[:len(yd)] for k, v in params.items()}, xd, yd)

    target = {k: v.detach() for k, v in upload(x, y).items()}
    init = torch.randn(n, 1, 1, 28, 28, device=device)
    kw = dict(loss="cosine", iterations=args.iterations, lr=0.1, tv=1e-4, image_shape=(1, 28, 28))

    def timed(fn):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    batched = timed(lambda: invert_gradients(upload, target, y, (1, 28, 28), init=init, **kw))
    loop = timed(lambda: [invert_gradients(upload, {k: v[i:i + 1] for k, v in target.items()}, y[i:i + 1],
                                           (1, 28, 28), init=init[i:i + 1], **kw) for i in range(n)])
    speedup = loop / batched
    ok = speedup >= TARGET_SPEEDUP
    print(f"{n} targets x {args.iterations} IG iterations, LeNet 1x28x28, {device}: batched {batched:.2f} s, "
          f"one at a time {loop:.2f} s; speedup {speedup:.2f}x (target >= {TARGET_SPEEDUP}) {'ok' if ok else 'MISS'}")
    return 0 if ok else 1


if __name__ == "__main__":
    if main():  # exit only on a miss, so benchmarks/run.py goes on to the next script
        sys.exit(1)
