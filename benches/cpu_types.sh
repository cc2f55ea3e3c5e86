#!/usr/bin/env bash
# CPU speed of hesper-rs beside llama.cpp's llama-bench on the same files, weight type by weight
# type, in interleaved rounds (each round runs every file on both engines), then one table of
# t/s and ratios. Prints markdown for BENCHMARKS.md.
#
#   HESPER_BIN=… LLAMA_BENCH=… benches/cpu_types.sh DIR [THREADS] [PP] [TG] [ROUNDS] [FILES…]
# DIR holds the Llama-3.2-1B-shaped files (`python golden-values/families.py --bench DIR`, or
# its F16 file through `llama-quantize` into each type): bench-llama1b-{f16,q8_0,q4_0,q4_k_m,
# q5_k_m,q6_k}.gguf; FILES names others in DIR (bench-2b4t-i2s.gguf from
# `golden-values/generate.py --bench-2b4t DIR`). HESPER_FLAGS adds flags to hesper-rs
# (`--cpu-kernels avx2` on an AVX-512 machine); HESPER_BEFORE names an earlier build, run in the
# same rounds (a `before` column). Build hesper-rs with `cargo build --release`: the test
# profile's overflow checks slow its kernels.
set -euo pipefail
dir=${1:?usage: benches/cpu_types.sh DIR [THREADS] [PP] [TG] [ROUNDS] [FILES…]}
threads=${2:-2}; pp=${3:-256}; tg=${4:-16}; rounds=${5:-2}
shift $(( $# < 5 ? $# : 5 ))
files=("$@")
if [ ${#files[@]} -eq 0 ]; then
  for t in f16 q8_0 q4_0 q4_k_m q5_k_m q6_k; do files+=("bench-llama1b-$t.gguf"); done
fi
hesper=${HESPER_BIN:?set HESPER_BIN to a release build of hesper-rs}
llama=${LLAMA_BENCH:?set LLAMA_BENCH to llama.cpp\'s llama-bench}
out=$(mktemp)
echo "$(date -u +%FT%TZ), $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $threads threads"
echo "hesper-rs: $("$hesper" --version | head -1); llama.cpp: $("$llama" --version 2>&1 | head -1)"
# One t/s figure of a markdown row of either tool: the column before the last holds
# "mean ± sd" in llama-bench's table, the last holds t/s in hesper-rs'.
# One hesper-rs build's rows of file $2 in round $3, tagged $4.
hesper_rows() {
  # shellcheck disable=SC2086
  "$1" bench -m "$dir/$2" -p "$pp" -n "$tg" -r 1 -t "$threads" --backend cpu ${HESPER_FLAGS:-} -o json \
    | python3 -c "import json,sys; [print('$3', '$2', '$4', r['test'], r['avg_ts']) for r in json.load(sys.stdin)]" >>"$out"
}
for round in $(seq 1 "$rounds"); do
  for f in "${files[@]}"; do
    [ -z "${HESPER_BEFORE:-}" ] || hesper_rows "$HESPER_BEFORE" "$f" "$round" before
    hesper_rows "$hesper" "$f" "$round" hesper
    # A file llama.cpp cannot run (I2_S) leaves its column empty.
    { "$llama" -m "$dir/$f" -p "$pp" -n "$tg" -r 1 -t "$threads" -o json 2>/dev/null || true; } \
      | python3 -c "
import json, sys
try:
    rows = json.load(sys.stdin)
except ValueError:
    rows = []
for r in rows:
    print('$round', '$f', 'llama', ('pp' if r['n_prompt'] else 'tg') + str(r['n_prompt'] or r['n_gen']), r['avg_ts'])" >>"$out"
  done
done
python3 - "$out" "$rounds" <<'EOF'
import collections, sys
rows = [l.split() for l in open(sys.argv[1])]
rounds = int(sys.argv[2])
got = collections.defaultdict(dict)
for r, f, tool, test, ts in rows:
    got[(f, test)][(tool, int(r))] = float(ts)
before = any(tool == "before" for _, _, tool, _, _ in rows)
print("| file | test |" + (" before t/s | before / llama.cpp |" if before else "")
      + " hesper-rs t/s | llama.cpp t/s | ratio |")
print("|---|---|" + ("---:|---:|" if before else "") + "---:|---:|---:|")
fmt = lambda xs: " / ".join("-" if x is None else f"{x:.2f}" for x in xs)
ratios = lambda a, b: " / ".join("-" if x is None or y is None else f"{x / y:.2f}×"
                                 for x, y in zip(a, b))
for (f, test), v in got.items():
    series = lambda tool: [v.get((tool, r)) for r in range(1, rounds + 1)]
    h, l, b = series("hesper"), series("llama"), series("before")
    cells = [f.removesuffix(".gguf"), test]
    if before:
        cells += [fmt(b), ratios(b, l)]
    cells += [fmt(h), fmt(l), ratios(h, l)]
    print("| " + " | ".join(cells) + " |")
EOF
rm -f "$out"
