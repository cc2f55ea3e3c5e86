#!/usr/bin/env bash
# Side-by-side CPU prefill and decode of hesper-rs and ik_llama.cpp on the 2B4T-shaped
# synthetic model, in interleaved rounds on the same machine. Prints markdown rows for
# BENCHMARKS.md.
#
#   benches/compare_ik.sh DIR IK_BUILD [THREADS] [PP] [TG] [ROUNDS]
# DIR holds bench-2b4t-i2s.gguf (python golden-values/generate.py --bench-2b4t DIR).
# IK_BUILD is an ik_llama.cpp build directory holding bin/llama-bench and bin/llama-quantize
# (CPU build of its public source, made outside this repository). Its own ternary types are made
# from our I2_S file once, with an F16 embedding/head as ours: IQ2_BN and IQ2_BN_R4 (its
# row-interleaved layout). ik_llama.cpp loads I2_S but computes nothing for it, so only its own
# types are compared. IK_REV names its commit in the rows.
# With LLAMA_BENCH set to a mainline llama.cpp llama-bench, each round also runs llama.cpp on
# DIR/bench-2b4t-tq2_0.gguf and hesper-rs with --cpu-kernels avx2 (what an AVX2-only host runs;
# build that llama-bench with -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_AVX512=OFF to match).
set -euo pipefail
dir=${1:?usage: benches/compare_ik.sh DIR IK_BUILD [THREADS] [PP] [TG] [ROUNDS]}
ik=${2:?usage: benches/compare_ik.sh DIR IK_BUILD [THREADS] [PP] [TG] [ROUNDS]}
threads=${3:-2}; pp=${4:-512}; tg=${5:-64}; rounds=${6:-2}
root=$(cd "$(dirname "$0")/.." && pwd)
i2s="$dir/bench-2b4t-i2s.gguf"
for type in IQ2_BN IQ2_BN_R4; do
  out="$dir/bench-2b4t-ik-$(echo "$type" | tr 'A-Z' 'a-z').gguf"
  [ -f "$out" ] || "$ik/bin/llama-quantize" --allow-requantize --token-embedding-type f16 \
    --output-tensor-type f16 "$i2s" "$out" "$type" 2 >/dev/null 2>&1
done
cargo build --release -q -p hesper-cli --manifest-path "$root/Cargo.toml"
bin="$root/target/release/hesper-rs"
echo "commit $(git -C "$root" rev-parse --short HEAD), $(date -u +%F), $(nproc) cores, load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs)," \
  "flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|avx512(f|bw|vl|_vnni|vbmi|_bf16)|avx_vnni)$' | tr '\n' ' ')"
echo "| round | engine, weights | pp$pp t/s | tg$tg t/s |"
echo "|---|---|---:|---:|"
ik_row() {
  local file=$1 label=$2 csv
  csv=$("$ik/bin/llama-bench" -m "$file" -p "$pp" -n "$tg" -r 1 -t "$threads" -o csv 2>/dev/null)
  local pp_ts tg_ts
  # CSV rows end with …,"avg_ts","stddev_ts","ppN" (or "tgN").
  pp_ts=$(echo "$csv" | awk -F'","' -v t="pp$pp\"" '$NF == t {print $(NF-2)}')
  tg_ts=$(echo "$csv" | awk -F'","' -v t="tg$tg\"" '$NF == t {print $(NF-2)}')
  printf '| %s | %s | %.2f | %.2f |\n' "$round" "$label" "$pp_ts" "$tg_ts"
}
hesper_row() {
  local label=$1; shift
  local out pp_ts tg_ts
  out=$("$bin" bench -m "$i2s" -p "$pp" -n "$tg" -r 1 -t "$threads" --backend cpu "$@" 2>/dev/null)
  pp_ts=$(echo "$out" | grep "| pp$pp |" | awk -F'|' '{print $9}' | awk '{print $1}')
  tg_ts=$(echo "$out" | grep "| tg$tg |" | awk -F'|' '{print $9}' | awk '{print $1}')
  printf '| %s | %s | %.2f | %.2f |\n' "$round" "$label" "$pp_ts" "$tg_ts"
}
llama_row() {
  local csv pp_ts tg_ts
  csv=$("$LLAMA_BENCH" -m "$dir/bench-2b4t-tq2_0.gguf" -p "$pp" -n "$tg" -r 1 -t "$threads" -o csv 2>/dev/null)
  # CSV rows end with …,"n_prompt","n_gen","n_depth","test_time","avg_ns","stddev_ns","avg_ts","stddev_ts".
  pp_ts=$(echo "$csv" | awk -F'","' -v n="$pp" 'NR > 1 && $(NF-7) == n && $(NF-6) == "0" {print $(NF-1)}')
  tg_ts=$(echo "$csv" | awk -F'","' -v n="$tg" 'NR > 1 && $(NF-7) == "0" && $(NF-6) == n {print $(NF-1)}')
  printf '| %s | %s | %.2f | %.2f |\n' "$round" "llama.cpp $("$LLAMA_BENCH" --version 2>&1 | grep -o 'commit [0-9a-f]*' | cut -d' ' -f2), TQ2_0" "$pp_ts" "$tg_ts"
}
ik_rev=${IK_REV:-$(git -C "$ik/.." rev-parse --short HEAD 2>/dev/null || echo "?")}
for round in $(seq 1 "$rounds"); do
  ik_row "$dir/bench-2b4t-ik-iq2_bn_r4.gguf" "ik_llama.cpp $ik_rev, IQ2_BN_R4"
  hesper_row "hesper-rs, I2_S repacked ×16 rows"
  ik_row "$dir/bench-2b4t-ik-iq2_bn.gguf" "ik_llama.cpp $ik_rev, IQ2_BN"
  hesper_row "hesper-rs, I2_S as in the file (--no-repack)" --no-repack
  if [ -n "${LLAMA_BENCH:-}" ]; then
    llama_row
    hesper_row "hesper-rs --cpu-kernels avx2, I2_S" --cpu-kernels avx2
  fi
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
