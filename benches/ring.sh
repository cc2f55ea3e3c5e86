#!/usr/bin/env bash
# The ring's overhead on loopback: `generate` on the whole model, then a ring of two nodes
# (master with the first half of the layers, worker with the rest, both on the CPU) over each
# transport and wire format, in interleaved rounds. Prints markdown rows for BENCHMARKS.md.
#
#   benches/ring.sh MODEL [THREADS] [PROMPT_TOKENS] [TG] [ROUNDS]
# Each row: prompt and generation speed from the master's (or generate's) closing lines, the
# bytes the master sent per generated token, and the time a token spends on the ring beyond
# the single process's (per hop: divided by the two hops).
set -euo pipefail
model=${1:?usage: benches/ring.sh MODEL [THREADS] [PROMPT_TOKENS] [TG] [ROUNDS]}
threads=${2:-2}; pp=${3:-128}; tg=${4:-64}; rounds=${5:-2}
root=$(cd "$(dirname "$0")/.." && pwd)
cargo build --release -q -p hesper-cli --manifest-path "$root/Cargo.toml"
bin="$root/target/release/hesper-rs"
n_layer=$("$bin" info -m "$model" 2>/dev/null | sed -n 's/^model: .*, \([0-9]*\) layers,.*/\1/p')
half=$((n_layer / 2))
# A prompt of about PROMPT_TOKENS tokens (one word per token in these vocabularies, roughly).
prompt=$(python3 -c "import sys; print(' '.join(['the'] * int(sys.argv[1])))" "$pp")
common=(-m "$model" -p "$prompt" -n "$tg" --temp 0 -t "$threads" --backend cpu -c $((pp + tg + 16)))
echo "commit $(git -C "$root" rev-parse --short HEAD), $(date -u +%F), $(nproc) cores, $model, layers 0..$half | $half..$n_layer"
echo "| run | pp t/s | tg t/s | bytes master → worker per token evaluated | ms per generated token over one process, per hop |"
echo "|---|---:|---:|---:|---:|"
# The closing lines' tokens per second: prompt, then generation.
speeds() { sed -n 's/.*(\s*[0-9.]* ms per token, *\([0-9.]*\) tokens per second)/\1/p' "$1" | paste -sd ' '; }
port=$((20000 + RANDOM % 20000))
for round in $(seq "$rounds"); do
  "$bin" generate "${common[@]}" > /dev/null 2> /tmp/ring-bench-single.err
  read -r pp_single tg_single < <(speeds /tmp/ring-bench-single.err)
  echo "| round $round: one process | $pp_single | $tg_single | — | — |"
  for transport in tcp udp uring; do
    for wire in f32 f16 q8_0; do
      port=$((port + 2))
      "$bin" node --role worker -m "$model" --layers "$half..$n_layer" -t "$threads" --backend cpu \
        --listen "127.0.0.1:$((port + 1))" --next "127.0.0.1:$port" --transport "$transport" 2> /dev/null &
      "$bin" node --role master "${common[@]}" --layers "0..$half" --transport "$transport" --wire "$wire" \
        --listen "127.0.0.1:$port" --next "127.0.0.1:$((port + 1))" > /dev/null 2> /tmp/ring-bench-master.err
      wait
      read -r pp_ring tg_ring < <(speeds /tmp/ring-bench-master.err)
      bytes=$(sed -n 's/^hesper: ring link to .*: [0-9]* frames, \([0-9]*\) bytes sent.*/\1/p' /tmp/ring-bench-master.err)
      tokens=$(sed -n 's/.*prompt eval time = *[0-9.]* ms \/ *\([0-9]*\) tokens.*/\1/p' /tmp/ring-bench-master.err)
      awk -v t="$transport" -v w="$wire" -v pp="$pp_ring" -v tg="$tg_ring" -v b="$bytes" -v n="$((tokens + tg))" -v s="$tg_single" -v r="$round" \
        'BEGIN { printf "| round %s: ring %s, wire %s | %s | %s | %.0f | %.2f |\n", r, t, w, pp, tg, b / n, (1000 / tg - 1000 / s) / 2 }'
    done
  done
done
