#!/usr/bin/env bash
# Side-by-side CPU speed of hesper-rs and llama.cpp on the 2B4T-shaped synthetic models,
# run back to back on the same machine. Prints markdown rows for BENCHMARKS.md.
#
#   benches/compare.sh DIR [THREADS] [PP] [TG] [REPS]
# DIR holds bench-2b4t-i2s.gguf, bench-2b4t-tq2_0.gguf and bench-2b4t-tq1_0.gguf, written by
#   python golden-values/generate.py --bench-2b4t DIR
# llama.cpp is reached through llama-cpp-python (golden-values/requirements.txt); set PYTHON to
# the interpreter of that venv.
set -euo pipefail
dir=${1:?usage: benches/compare.sh DIR [THREADS] [PP] [TG] [REPS]}
threads=${2:-2}; pp=${3:-128}; tg=${4:-64}; reps=${5:-3}
python=${PYTHON:-python3}
root=$(cd "$(dirname "$0")/.." && pwd)
cargo build --release -q -p hesper-cli -p hesper-benches --manifest-path "$root/Cargo.toml"
bin="$root/target/release"
echo "commit $(git -C "$root" rev-parse --short HEAD), $(date -u +%F), $(nproc) cores, load: $(cut -d' ' -f1-3 /proc/loadavg)"
"$bin/membw" "$threads" 2
"$python" "$root/benches/llama_cpp_bench.py" "$dir/bench-2b4t-tq2_0.gguf" -p "$pp" -n "$tg" -r "$reps" -t "$threads" 2>/dev/null
for head in exact q8_0 q6_k; do
  "$bin/hesper-rs" bench -m "$dir/bench-2b4t-i2s.gguf" -p "$pp" -n "$tg" -r "$reps" -t "$threads" --backend cpu \
    --lm-head "$head" --roofline | grep -E '^\| bench-2b4t|roofline'
done
for tq in tq2_0 tq1_0; do
  [ "$tq" = tq2_0 ] || "$python" "$root/benches/llama_cpp_bench.py" "$dir/bench-2b4t-$tq.gguf" -p "$pp" -n "$tg" -r "$reps" -t "$threads" 2>/dev/null
  "$bin/hesper-rs" bench -m "$dir/bench-2b4t-$tq.gguf" -p "$pp" -n "$tg" -r "$reps" -t "$threads" --backend cpu | grep '^| bench-2b4t'
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
