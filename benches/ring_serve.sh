#!/usr/bin/env bash
# Serving over a ring on one machine: aggregate decode speed of 1, 2, 4 and 8 concurrent streams
# through `serve --ring` (a master and one worker, each pinned to its own core with -t 1, over
# loopback with an emulated link delay) against `serve` on one node with -t 1, and against the
# same ring with one step in flight (`--ring-inflight 1`: the nodes compute in turn). All three
# servers run at once and benches/serve.py measures them in interleaved rounds. Then the
# single-stream speed of `node --role master` (the command-line ring), and of the binary in
# $OLD_BIN when set (an earlier build's command-line ring), for the same split. Prints markdown.
#
#   benches/ring_serve.sh MODEL [LAYERS] [CLIENTS] [TOKENS] [ROUNDS] [DELAY_MS]
#     LAYERS    the master's layers (0..K) or auto (default: auto, printed plan)
#     CLIENTS   concurrent streams (default 1,2,4,8)
#     TOKENS    tokens per stream (default 64)
#     ROUNDS    interleaved rounds (default 2)
#     DELAY_MS  one-way delay on every link (default 0.5, a LAN's)
# Extra flags for every node: RING_FLAGS (e.g. "--lm-head q6_k").
set -euo pipefail
model=${1:?usage: benches/ring_serve.sh MODEL [LAYERS] [CLIENTS] [TOKENS] [ROUNDS] [DELAY_MS]}
layers=${2:-auto}; clients=${3:-1,2,4,8}; tokens=${4:-64}; rounds=${5:-2}; delay=${6:-0.5}
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${HESPER_BIN:-$root/target/release/hesper-rs}
read -r -a extra <<< "${RING_FLAGS:-}"
common=(-m "$model" -t 1 --backend cpu "${extra[@]}")
serve=(serve "${common[@]}" -np 8 -c 512)
base=$((20000 + RANDOM % 20000))
pids=()
cleanup() { kill "${pids[@]}" 2> /dev/null || true; wait 2> /dev/null || true; }
trap cleanup EXIT
wait_ready() { until curl -sf "http://127.0.0.1:$1/health" > /dev/null; do sleep 0.5; done; }
# A ring on ports $1 (master), $1+1 (worker), HTTP $2: the master holds $3 (a range or auto),
# the worker $4 (a range, or "" to be assigned), then the master's extra flags.
ring() {
  local p=$1 http=$2 master=$3 worker=$4; shift 4
  taskset -c 1 "$bin" node --role worker "${common[@]}" ${worker:+--layers "$worker"} \
    --listen "127.0.0.1:$((p + 1))" --next "127.0.0.1:$p" --link-delay "$delay" 2> /dev/null &
  pids+=($!)
  taskset -c 0 "$bin" "${serve[@]}" --port "$http" --ring --layers "$master" \
    --listen "127.0.0.1:$p" --next "127.0.0.1:$((p + 1))" --link-delay "$delay" "$@" \
    2> "/tmp/ring-serve-$http.err" &
  pids+=($!)
}
taskset -c 0 "$bin" "${serve[@]}" --port $((base + 10)) --log-disable 2> /dev/null &
pids+=($!)
wait_ready $((base + 10))
worker=""
[ "$layers" = auto ] || worker="${layers#*..}..$("$bin" info -m "$model" 2> /dev/null | sed -n 's/^model: .*, \([0-9]*\) layers,.*/\1/p')"
ring "$base" $((base + 11)) "$layers" "$worker"
wait_ready $((base + 11))
# The same split for the ring with one step in flight.
split=$(sed -n 's/^hesper: ring node 0: .*(layers \([0-9]*\.\.[0-9]*\),.*/\1/p' "/tmp/ring-serve-$((base + 11)).err")
n_layer=$("$bin" info -m "$model" 2> /dev/null | sed -n 's/^model: .*, \([0-9]*\) layers,.*/\1/p')
end=${split#*..}
ring $((base + 2)) $((base + 12)) "$split" "$end..$n_layer" --ring-inflight 1
wait_ready $((base + 12))
echo "commit $(git -C "$root" rev-parse --short HEAD), $(date -u +%F), $(nproc) cores ($(lscpu | sed -n 's/^Model name: *//p')), $model, link delay $delay ms, ${extra[*]:-}"
grep '^|' "/tmp/ring-serve-$((base + 11)).err" || echo "layers $split | $end..$n_layer (given)"
python3 "$root/benches/serve.py" "one node=http://127.0.0.1:$((base + 10))" \
  "ring=http://127.0.0.1:$((base + 11))" "ring, 1 in flight=http://127.0.0.1:$((base + 12))" \
  --clients "$clients" --tokens "$tokens" --rounds "$rounds" --long-words 0
cleanup
pids=()
# The command-line ring, one stream, on the same split: its own closing line's tokens per
# second (no link delay: an earlier build cannot emulate one).
echo
echo "| command-line ring (one stream, layers $split, $end..$n_layer) | binary | tg t/s |"
echo "|---|---|---:|"
for round in $(seq "$rounds"); do
  for b in "$bin" ${OLD_BIN:+"$OLD_BIN"}; do
    p=$((base + 20 + 2 * round))
    taskset -c 1 "$b" node --role worker "${common[@]}" --layers "$end..$n_layer" \
      --listen "127.0.0.1:$((p + 1))" --next "127.0.0.1:$p" 2> /dev/null &
    tg=$(taskset -c 0 "$b" node --role master "${common[@]}" --layers "$split" -c 512 \
      --listen "127.0.0.1:$p" --next "127.0.0.1:$((p + 1))" -p "the the the the" -n "$tokens" \
      --temp 0.8 --seed 1 2>&1 > /dev/null |
      sed -n 's/.*eval time.*runs.*(\s*[0-9.]* ms per token, *\([0-9.]*\) tokens per second)/\1/p')
    wait
    echo "| round $round | $(basename "$(dirname "$(dirname "$b")")")/$(basename "$b") | $tg |"
  done
done
