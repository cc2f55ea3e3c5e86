#!/usr/bin/env bash
# The plan of `--layers auto` against every split a ring of two nodes can have: a master on
# one backend (core 0) and a worker on another (core 1), each given one thread, generating
# TOKENS tokens of one stream (`node --role master`); first with every node's layers assigned
# (the plan it prints), then with each split 0..K | K..END given by hand (0..0: the master holds
# the embedding alone). Prints markdown:
# each split's decode speed, the plan's, and the plan's against the best split's.
#
#   benches/ring_plan.sh MODEL [MASTER_BACKEND] [WORKER_BACKEND] [TOKENS]
#     backends: gpu (on this machine without a GPU: lavapipe) or cpu; default gpu, cpu
# A model with few layers keeps this short: `golden-values/generate.py --bench-2b4t DIR
# --bench-layers 8` writes the 2B4T shape with 8 layers.
set -euo pipefail
model=${1:?usage: benches/ring_plan.sh MODEL [MASTER_BACKEND] [WORKER_BACKEND] [TOKENS]}
mb=${2:-gpu}; wb=${3:-cpu}; tokens=${4:-16}
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${HESPER_BIN:-$root/target/release/hesper-rs}
export WGPU_BACKEND=${WGPU_BACKEND:-vulkan} LP_NUM_THREADS=1
n_layer=$("$bin" info -m "$model" 2> /dev/null | sed -n 's/^model: .*, \([0-9]*\) layers,.*/\1/p')
port=$((20000 + RANDOM % 20000))
# One run: the master's layers and the worker's (`auto`: assigned); prints the master's stderr.
run() {
  port=$((port + 2))
  local worker=()
  [ "$2" = auto ] || worker=(--layers "$2")
  taskset -c 1 "$bin" node --role worker -m "$model" "${worker[@]}" -t 1 --backend "$wb" \
    --listen "127.0.0.1:$((port + 1))" --next "127.0.0.1:$port" 2> /dev/null &
  taskset -c 0 "$bin" node --role master -m "$model" --layers "$1" -t 1 --backend "$mb" -c 256 \
    --listen "127.0.0.1:$port" --next "127.0.0.1:$((port + 1))" -p "the the the the" \
    -n "$tokens" --temp 0 2>&1 > /dev/null
  wait
}
speed() { sed -n 's/.*eval time.*runs.*(\s*[0-9.]* ms per token, *\([0-9.]*\) tokens per second)/\1/p'; }
auto=$(run auto auto)
pick=$(sed -n 's/^hesper: ring node 0: .*(layers \([0-9]*\.\.[0-9]*\),.*/\1/p' <<< "$auto")
echo "commit $(git -C "$root" rev-parse --short HEAD), $(date -u +%F), $model ($n_layer layers), master $mb on core 0, worker $wb on core 1, $tokens tokens"
grep '^|' <<< "$auto"
echo
echo "| master's layers | decode t/s |"
echo "|---|---:|"
best=0
for k in $(seq 0 $((n_layer - 1))); do
  tg=$(run "0..$k" "$k..$n_layer" | speed)
  echo "| 0..$k | $tg |"
  best=$(awk -v a="$best" -v b="$tg" 'BEGIN { print (b > a) ? b : a }')
done
tg=$(speed <<< "$auto")
echo "| auto: $pick | $tg |"
awk -v a="$tg" -v b="$best" 'BEGIN { printf "\nthe plan gives %.0f %% of the best split'"'"'s speed\n", 100 * a / b }'
