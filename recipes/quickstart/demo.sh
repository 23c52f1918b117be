#!/usr/bin/env bash
# The README's demo: every stage of pflx that exists, chained through artifact directories,
# on scikit-learn's bundled digits (no download). Usage: bash recipes/quickstart/demo.sh [OUT_ROOT]
set -euo pipefail
root=${1:-runs/demo}
pflx() { python -m pfl_cli "$@"; }

echo "== partition: 50 clients, Dirichlet(0.1) label skew, 10 holdout clients"
pflx partition --config recipes/quickstart/digits-partition.yaml --out "$root/part" --force

echo "== mdm-fit: a mixture of Dirichlet-multinomials fitted to the 40 train clients' label histograms"
pflx mdm-fit --partition "$root/part" --components 1-3 --out "$root/mdm" --force

echo "== simulate: 200 clients dealt from the digits like the fitted model says"
pflx simulate --model "$root/mdm" --dataset builtin:digits --num-clients 200 --holdout-clients 0.1 --out "$root/sim" --force

echo "== privacy-account: DP-FedAvg style accounting, both accountants side by side"
pflx privacy-account --noise-multiplier 1.1 --population 40 --cohort-size 4 --rounds 200 --delta 1e-3 --accountant all

echo "== cluster: FedDP-KMeans at epsilon 1 on a small synthetic Gaussian mixture (20 clients x 200 points)"
pflx partition --dataset "gmm:clients?seed=0&num_clients=20&client_size=200" --natural-id --test-fraction 0 \
  --out "$root/gmm" --force --format quiet
pflx cluster --partition "$root/gmm" --server-data "gmm:server?seed=0&num_clients=20&client_size=200" --k 10 \
  --dp eps=1 --out "$root/km" --force
