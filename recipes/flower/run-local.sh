#!/usr/bin/env bash
# Run a pflx Flower app on this machine: one flower-superlink and N flower-supernode processes on
# 127.0.0.1 (insecure mode: loopback only, never across a network; docs/tutorials/deploy-flower.md
# shows TLS and node authentication for real use), `flwr run` the app, then stop every process
# started here, by pid, whatever happens.
#
#   recipes/flower/run-local.sh APPDIR PARTITION N [BASE_PORT]
#
# SuperNode k (k = 0..N-1) holds client k of PARTITION (node config partition-dir, partition-id).
# Logs go to APPDIR.logs/ (superlink.log, supernode-K.log, run.log). Exit status: flwr run's, or 1
# when the run did not finish; the ServerApp writes the train artifact (run config `out`).
# Environment: FLWR_BIN (directory of the flower-* and flwr executables, default: from PATH),
# RUN_TIMEOUT (seconds, default 600).
set -euo pipefail
app=$(cd "$1" && pwd); part=$(cd "$2" && pwd); n=$3; base=${4:-19091}
[ -n "${FLWR_BIN:-}" ] && export PATH="$FLWR_BIN:$PATH"
logs="$app.logs"; mkdir -p "$logs"
export FLWR_HOME="$logs/flwr-home"; mkdir -p "$FLWR_HOME"
# flwr 1.42 serves the Runtime, Control and Fleet APIs on one HTTP address.
link=127.0.0.1:$base
cat > "$FLWR_HOME/config.toml" <<TOML
[superlink]
default = "local"

[superlink.local]
address = "$link"
insecure = true
TOML
pids=()
# The SuperLink and SuperNodes start helpers of their own (flower-superexec, flwr-serverapp,
# flwr-clientapp) in new sessions: collect the whole tree of pids started here, then stop it.
descendants() { local child; for child in $(pgrep -P "$1" 2>/dev/null); do echo "$child"; descendants "$child"; done; }
cleanup() {
  local all=() pid
  for pid in "${pids[@]}"; do all+=("$pid" $(descendants "$pid")); done
  for pid in "${all[@]}"; do kill "$pid" 2>/dev/null || true; done
  sleep 1
  for pid in "${all[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT INT TERM
"flower-superlink" --insecure --disable-runtime-dependency-installation \
  --host 127.0.0.1 --port "$base" \
  > "$logs/superlink.log" 2>&1 &
pids+=($!)
for ((k = 0; k < n; k++)); do
  "flower-supernode" --insecure --superlink "$link" \
    --host 127.0.0.1 --port "$((base + 10 + k))" \
    --node-config "partition-dir='$part' partition-id=$k" > "$logs/supernode-$k.log" 2>&1 &
  pids+=($!)
done
# Wait (up to 60 s) until the SuperLink's Control API accepts connections.
for ((i = 0; i < 120; i++)); do
  (exec 3<>"/dev/tcp/127.0.0.1/$base") 2>/dev/null && break
  kill -0 "${pids[0]}" 2>/dev/null || { cat "$logs/superlink.log" >&2; exit 1; }
  sleep 0.5
done
(exec 3<>"/dev/tcp/127.0.0.1/$base") 2>/dev/null || { echo "the SuperLink did not open 127.0.0.1:$base" >&2; exit 1; }
echo "superlink and $n supernodes started (pids ${pids[*]}); logs in $logs" >&2
# `flwr run` returns once the run is submitted; `--stream` follows its logs until it ends.
timeout "${RUN_TIMEOUT:-600}" "flwr" run "$app" local --stream > "$logs/run.log" 2>&1 || status=$?
cat "$logs/run.log" >&2
exit "${status:-0}"
