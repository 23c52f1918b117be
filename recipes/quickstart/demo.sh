#!/usr/bin/env bash
# The README's demo: every stage of pflx that exists, chained through artifact directories,
# on scikit-learn's bundled digits (no download). Usage: bash recipes/quickstart/demo.sh [OUT_ROOT]
# About six minutes on 2 idle CPU cores (pFedHN's one-client server steps are most of the added time);
# re-running is a no-op per stage (same config and inputs).
set -euo pipefail
root=${1:-runs/demo}
pflx() { python -m pfl_cli "$@"; }
# One torch thread is fastest for these tiny models (torch reads this at start-up).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

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

# PeFLL, pFedHN, FedAvg and Local: recipes/quickstart/digits-pefll.yaml holds the partition, train and
# predict settings. The partition above has Dirichlet skew; this one gives every client exactly 2 classes.
recipe=recipes/quickstart/digits-pefll.yaml
echo "== partition: 50 clients with 2 classes each (equal shares), 10 holdout clients, 30% test per client"
pflx partition --config "$recipe" --out "$root/digits" --force --format quiet

echo "== train: PeFLL, 400 rounds of 5 clients x 50 local steps (client MLP 64-32-10, hypernetwork M)"
pflx train --config "$recipe" --partition "$root/digits" --out "$root/pefll" --force --plot  # + curves.png
echo "== train: pFedHN, 400 server steps of 1 client x 50 local steps (its paper's settings: digits-pfedhn.yaml)"
pflx train --config recipes/quickstart/digits-pfedhn.yaml --partition "$root/digits" --out "$root/pfedhn" --force \
  --format quiet --rounds 400 --plot
echo "== train: FedAvg, same rounds; client lr 0.005 (stable under label skew), server step 1 on the mean delta"
pflx train --config "$recipe" --partition "$root/digits" --out "$root/fedavg" --force \
  --set algorithm=fedavg --lr 0.005 --server-lr 1
echo "== train: Local, 200 epochs per client, no communication"
pflx train --config "$recipe" --partition "$root/digits" --out "$root/local" --force --set algorithm=local

echo "== predict: models for the 10 holdout clients, never seen in training, without and with label masking"
for m in pefll pfedhn fedavg local; do
  pflx predict --config "$recipe" --model "$root/$m" --partition "$root/digits" --clients holdout --no-label-mask \
    --out "$root/$m-holdout" --force --format quiet
  pflx predict --config "$recipe" --model "$root/$m" --partition "$root/digits" --clients holdout --label-mask \
    --out "$root/$m-holdout-lm" --force --format quiet
done

echo "== ring: 100 clients with 2 of the 10 ring classes each, 20 holdout; one global model is capped near 47%"
ring=recipes/quickstart/ring-pefll.yaml
pflx partition --config "$ring" --out "$root/ring" --force --format quiet
echo "== ring train: PeFLL (300 rounds), pFedHN (1000 steps of 1 client), FedAvg (150 rounds, client lr 0.005), Local (50 epochs)"
pflx train --config "$ring" --partition "$root/ring" --out "$root/ring-pefll" --force --format quiet --plot
pflx train --config recipes/quickstart/ring-pfedhn.yaml --partition "$root/ring" --out "$root/ring-pfedhn" --force \
  --format quiet --plot
pflx train --config "$ring" --partition "$root/ring" --out "$root/ring-fedavg" --force --format quiet \
  --set algorithm=fedavg --lr 0.005 --server-lr 1 --rounds 150
pflx train --config "$ring" --partition "$root/ring" --out "$root/ring-local" --force --format quiet \
  --set algorithm=local --set local_epochs=50
for m in pefll pfedhn fedavg local; do
  pflx predict --config "$ring" --model "$root/ring-$m" --partition "$root/ring" --no-label-mask \
    --out "$root/ring-$m-holdout" --force --format quiet
  pflx predict --config "$ring" --model "$root/ring-$m" --partition "$root/ring" --label-mask \
    --out "$root/ring-$m-holdout-lm" --force --format quiet
done

python recipes/quickstart/demo_tables.py "$root"
