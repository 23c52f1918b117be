#!/usr/bin/env bash
# The README's demo: every stage of pflx that exists, chained through artifact directories,
# on scikit-learn's bundled digits (no download). Usage: bash recipes/quickstart/demo.sh [OUT_ROOT]
# Needs only the runtime (`make demo` installs nothing else; figures: `pflx show --plot` with the plot
# extra). The comparisons (4 methods x seeds 0, 1, 2 x 2 tasks: 24 trainings, 24 predictions) take about
# 14 CPU-minutes (2026-11-27: 845 CPU s, 863 s wall on a 2-core machine shared with other jobs at load ~5),
# over half of it pFedHN's one-client server steps; three seeds run at a time, so idle cores shorten the wall
# time. Re-running is a no-op per stage (about 1 CPU-minute in all).
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

# PeFLL, pFedHN, FedAvg and Local, seeds 0, 1 and 2 of each on one partition, then `pflx compare`:
# mean over seeds ± the 95 % interval, and fairness across clients. One job per seed runs in the
# background (one torch thread each); its output goes to $root/logs/, which is printed if the job fails,
# and a failed job fails the script. Every 10 s the latest progress line of each seed's log is printed, so
# the terminal (or a log of `make demo`) never stays silent for the minutes the trainings take.
seeds=(0 1 2)
methods=(pefll pfedhn fedavg local)
each_seed() {  # each_seed NAME FUNCTION: FUNCTION SEED for every seed at once; fails if any of them fails
  local name=$1 fn=$2 s pids=() failed=0
  mkdir -p "$root/logs"
  for s in "${seeds[@]}"; do
    "$fn" "$s" >"$root/logs/$name-s$s.log" 2>&1 &
    pids+=($!)
  done
  local tick=0 pid alive line
  while :; do  # a heartbeat: each seed's latest progress line, every 10 s, until every job has ended
    alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" = 1 ] || break
    sleep 1
    tick=$((tick + 1))
    if [ $((tick % 10)) = 0 ]; then
      for s in "${seeds[@]}"; do
        line=$(grep -E '^[a-z -]+: [a-z]+ [0-9]+' "$root/logs/$name-s$s.log" | tail -n 1 || true)
        echo "   $name, seed $s: ${line:-starting}"
      done
    fi
  done
  for s in "${!pids[@]}"; do
    if ! wait "${pids[$s]}"; then
      failed=1
      echo "!! $name, seed ${seeds[$s]} failed ($root/logs/$name-s${seeds[$s]}.log):" >&2
      cat "$root/logs/$name-s${seeds[$s]}.log" >&2
    fi
  done
  return "$failed"
}
# The recipes are PeFLL's and pFedHN's (embedding, hypernetwork...): FedAvg and Local own other keys,
# so they get the shared client settings as flags (`pflx algorithms fedavg` lists a FedAvg run's keys).
client=(--batch-size 32 --model-arch mlp --set "mlp_hidden=[32]" --val-fraction 0.1 --device cpu)
# New clients: the partition's holdout clients, each served with its algorithm's own protocol; predict
# reports the accuracy with and without label masking, the table shows both in separate columns.
new_clients() {  # new_clients TASK RECIPE SEED: the runs are $root/TASK-METHOD-sSEED
  local m
  for m in "${methods[@]}"; do
    pflx predict --config "$2" --model "$root/$1-$m-s$3" --partition "$root/$1" --clients holdout \
      --no-label-mask --no-predictions --out "$root/$1-$m-s$3-new" --force
  done
}
compare() {  # compare TASK: every method and seed of TASK, training and new clients, in one table
  local m s runs=()
  for m in "${methods[@]}"; do for s in "${seeds[@]}"; do runs+=("$root/$1-$m-s$s" "$root/$1-$m-s$s-new"); done; done
  pflx compare "${runs[@]}" --out "$root/$1-table" --force --format quiet
}

recipe=recipes/quickstart/digits-pefll.yaml
echo "== partition: 50 clients with 2 classes each (equal shares), 10 holdout clients, 30% test per client"
pflx partition --config "$recipe" --out "$root/digits" --force --format quiet
digits_seed() {
  set -e
  local s=$1
  # PeFLL: 400 rounds of 5 clients x 50 local steps (client MLP 64-32-10, hypernetwork M)
  pflx train --config "$recipe" --partition "$root/digits" --out "$root/digits-pefll-s$s" --seed "$s" --force
  # pFedHN: 400 server steps of 1 client x 50 local steps (its paper's settings: digits-pfedhn.yaml)
  pflx train --config recipes/quickstart/digits-pfedhn.yaml --partition "$root/digits" \
    --out "$root/digits-pfedhn-s$s" --seed "$s" --force --rounds 400
  # FedAvg: same rounds; client lr 0.005 (stable under label skew), server step 1 on the mean delta
  pflx train --partition "$root/digits" --out "$root/digits-fedavg-s$s" --force --algorithm fedavg \
    "${client[@]}" --seed "$s" --rounds 400 --eval-every 50 --clients-per-round 5 --local-steps 50 --lr 0.005 \
    --server-lr 1 --no-label-mask
  # Local: 200 epochs per client, no communication
  pflx train --partition "$root/digits" --out "$root/digits-local-s$s" --force --algorithm local \
    "${client[@]}" --seed "$s" --lr 0.05 --local-epochs 200
  new_clients digits "$recipe" "$s"
}
echo "== digits, seeds ${seeds[*]} at once: train PeFLL (400 rounds), pFedHN (400 steps of 1 client), FedAvg (400"
echo "   rounds, client lr 0.005), Local (200 epochs); predict the 10 holdout clients, never seen in training"
each_seed digits digits_seed
compare digits

echo "== ring: 100 clients with 2 of the 10 ring classes each, 20 holdout; one global model is capped near 47%"
ring=recipes/quickstart/ring-pefll.yaml
pflx partition --config "$ring" --out "$root/ring" --force --format quiet
ring_seed() {
  set -e
  local s=$1
  pflx train --config "$ring" --partition "$root/ring" --out "$root/ring-pefll-s$s" --seed "$s" --force
  pflx train --config recipes/quickstart/ring-pfedhn.yaml --partition "$root/ring" --out "$root/ring-pfedhn-s$s" \
    --seed "$s" --force
  pflx train --partition "$root/ring" --out "$root/ring-fedavg-s$s" --force --algorithm fedavg \
    "${client[@]}" --seed "$s" --rounds 150 --eval-every 50 --clients-per-round 5 --local-steps 50 --lr 0.005 \
    --server-lr 1 --label-mask
  pflx train --partition "$root/ring" --out "$root/ring-local-s$s" --force --algorithm local \
    "${client[@]}" --seed "$s" --lr 0.05 --local-epochs 50 --label-mask
  new_clients ring "$ring" "$s"
}
echo "== ring, seeds ${seeds[*]} at once: train PeFLL (300 rounds), pFedHN (1000 steps of 1 client), FedAvg (150"
echo "   rounds, client lr 0.005), Local (50 epochs); predict the 20 holdout clients"
each_seed ring ring_seed
compare ring

python recipes/quickstart/demo_tables.py "$root"
