#!/usr/bin/env bash
# The GPU's speed in one command, on a machine that has a GPU and nothing of hesper-rs installed.
#
#   bash benches/gpu.sh [OUT]          # the 2B4T shape (I2_S, TQ2_0), then Llama-3.2-1B-shaped
#                                      # F16, Q8_0 and Q4_K_M: pp512 / tg128, two interleaved
#                                      # rounds beside llama.cpp's Vulkan llama-bench (minutes,
#                                      # most of them writing the models)
#   bash benches/gpu.sh --smoke [OUT]  # the built-in model, a few tokens: checks the harness
#                                      # end to end on any adapter (lavapipe too)
#   bash benches/gpu.sh --fetch-debs   # run once where apt works: the Vulkan loader's Debian
#                                      # packages into benches/gpu-debs, for machines without it
#
# It writes into OUT (default gpu-bench): machine.txt (GPU, driver, CPU, commit), adapter.txt
# (`hesper-rs info --backend gpu`), hesper-NAME-rN.json for each model and round N (`bench
# --backend gpu --roofline --json`: t/s, dispatches per token, the device's copy bandwidth, the
# share of the roofline, GPU time per kernel), llama-vulkan-NAME-rN.json for the files llama.cpp
# reads when its llama-bench is given (each right after ours on the same file), pairs.txt (which
# of our files is compared with which of theirs), and summary.md, the tables BENCHMARKS.md
# records: the ratios of each round first.
#
# Environment:
#   HESPER_BIN   the hesper-rs binary; default: `cargo build --release -p hesper-cli` where cargo
#                exists, else target/release/hesper-rs as it was brought along
#   MODELS       where the models are written (`golden-values/generate.py --bench-2b4t` and
#                `golden-values/families.py --bench`, numpy needed) or found; default
#                /tmp/hesper-bench-gpu
#   FAMILIES     0: the 2B4T shape only (about 3 minutes); FALCON3=1 adds the Falcon3-3B-shaped
#                I2_S file (hesper-rs alone: mainline llama.cpp has no I2_S); MOE=1 adds two
#                mixtures of experts beside llama.cpp (`golden-values/families.py --bench-moe`,
#                llama-quantize needed, about 10 GB of F16 on the way): Qwen3-30B-A3B's layers
#                cut to 4 (Q4_K_M) and gpt-oss-20b's cut to 2 (MXFP4_MOE)
#   GPU_DEBS     .deb packages unpacked (into a private folder, not /) when no Vulkan loader is
#                installed; default benches/gpu-debs
#   LLAMA_BENCH  llama.cpp's llama-bench built with -DGGML_VULKAN=ON (`-ngl 99`): run on the
#                2B4T TQ2_0 file (the I2_S file's weights) and the Llama-1B files, beside
#                hesper-rs; default benches/llama-vulkan/llama-bench. The llama-quantize beside it
#                makes the Q4_K_M file (LLAMA_QUANTIZE; without one that file is left out)
#   PP TG REPS   prompt tokens, generated tokens, repetitions (512, 128, 2)
#   ROUNDS       rounds of every test (2): each round runs every file, ours then theirs
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
debs_dir=${GPU_DEBS:-$root/benches/gpu-debs}

if [ "${1:-}" = --fetch-debs ]; then
  mkdir -p "$debs_dir"
  # The loader and the GL vendor-neutral dispatch libraries NVIDIA's Vulkan driver links to.
  (cd "$debs_dir" && apt-get download libvulkan1 libglvnd0 libegl1 libgl1 libglx0 libgles2 libopengl0)
  ls -l "$debs_dir"
  exit 0
fi
smoke=false
if [ "${1:-}" = --smoke ]; then smoke=true; shift; fi
out=$(mkdir -p "${1:-gpu-bench}" && cd "${1:-gpu-bench}" && pwd)
pp=${PP:-512}; tg=${TG:-128}; reps=${REPS:-2}; rounds=${ROUNDS:-2}
if $smoke; then pp=${PP:-8}; tg=${TG:-4}; reps=${REPS:-1}; rounds=${ROUNDS:-1}; fi
t_start=$SECONDS
step() { echo "== $* ($((SECONDS - t_start)) s)"; }

step "Vulkan loader"
if ! ldconfig -p 2>/dev/null | grep 'libvulkan\.so\.1 ' >/dev/null; then
  ls "$debs_dir"/*.deb >/dev/null 2>&1 || {
    echo "no Vulkan loader here and no .deb packages in $debs_dir (bash benches/gpu.sh --fetch-debs)" >&2
    exit 1
  }
  sysroot=$(mktemp -d)
  for f in "$debs_dir"/*.deb; do dpkg -x "$f" "$sysroot"; done
  export LD_LIBRARY_PATH="$sysroot/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "unpacked $(ls "$debs_dir"/*.deb | wc -l) packages into $sysroot"
fi
# A driver manifest outside the loader's default folders (NVIDIA's container layout) is named.
if [ -z "${VK_DRIVER_FILES:-}${VK_ICD_FILENAMES:-}" ]; then
  for d in /usr/share/vulkan/icd.d /etc/vulkan/icd.d /usr/local/share/vulkan/icd.d; do
    ls "$d"/*.json >/dev/null 2>&1 && break
    d=
  done
  if [ -z "$d" ]; then
    icd=$(ls /usr/local/nvidia/share/vulkan/icd.d/*.json /usr/local/nvidia/etc/vulkan/icd.d/*.json 2>/dev/null | head -1 || true)
    if [ -n "$icd" ]; then
      export VK_DRIVER_FILES=$icd VK_ICD_FILENAMES=$icd
      echo "driver manifest: $icd"
    fi
  fi
fi
export WGPU_BACKEND=${WGPU_BACKEND:-vulkan}
[ "$(uname -s)" = Linux ] && export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-$(mktemp -d)}

step "hesper-rs binary"
if [ -n "${HESPER_BIN:-}" ]; then
  bin=$HESPER_BIN
elif command -v cargo >/dev/null; then
  cargo build --release -q -p hesper-cli --manifest-path "$root/Cargo.toml"
  bin=$root/target/release/hesper-rs
else
  bin=$root/target/release/hesper-rs
fi
[ -x "$bin" ] || { echo "no hesper-rs binary at $bin (set HESPER_BIN, or install cargo)" >&2; exit 1; }

{
  echo "tree: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u '+%F %T UTC')"
  echo "binary: $bin, sha256 $(sha256sum "$bin" | cut -c1-16) (HESPER_BIN may be another commit's build)"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) threads"
} | tee "$out/machine.txt"
"$bin" info --backend gpu >"$out/adapter.txt" 2>&1
grep -m1 '^adapter' "$out/adapter.txt" || { cat "$out/adapter.txt"; exit 1; }

llama=${LLAMA_BENCH:-$root/benches/llama-vulkan/llama-bench}
quantizer=${LLAMA_QUANTIZE:-$(dirname "$llama")/llama-quantize}
# name, file, the name of llama.cpp's file it is measured against ("" for none; mainline
# llama.cpp has no I2_S: the 2B4T I2_S file is set beside llama.cpp's TQ2_0 of the same weights),
# and flags of our bench for that run
runs=()
if $smoke; then
  runs+=("i2s|$root/models/hesper-kjv.gguf|")
else
  step "models"
  dir=${MODELS:-/tmp/hesper-bench-gpu}
  if [ ! -s "$dir/bench-2b4t-i2s.gguf" ] || [ ! -s "$dir/bench-2b4t-tq2_0.gguf" ]; then
    python3 "$root/golden-values/generate.py" --bench-2b4t "$dir" | grep -v '^  layer'
  fi
  runs+=("i2s|$dir/bench-2b4t-i2s.gguf|tq2_0" "tq2_0|$dir/bench-2b4t-tq2_0.gguf|tq2_0")
  # Where I2_S, TQ, Q8_0 and K-quant prompts run on matrix cores, those files on the shader
  # cores too.
  cores=false
  grep -q 'K-quant prompts on matrix cores' "$out/adapter.txt" && cores=true
  if $cores; then
    runs+=("i2s-shader-cores|$dir/bench-2b4t-i2s.gguf|tq2_0|--gpu-matrix-cores off")
    runs+=("tq2_0-shader-cores|$dir/bench-2b4t-tq2_0.gguf|tq2_0|--gpu-matrix-cores off")
  fi
  if [ "${FAMILIES:-1}" != 0 ]; then
    files=(llama1b-f16 llama1b-q8_0)
    if [ -x "$quantizer" ]; then
      files+=(llama1b-q4_k_m)
    else
      echo "no llama-quantize at $quantizer: the Q4_K_M file is left out" >&2
    fi
    [ "${FALCON3:-0}" = 1 ] && files+=(falcon3b-i2s)
    missing=()
    for m in "${files[@]}"; do [ -s "$dir/bench-$m.gguf" ] || missing+=("$m"); done
    if [ ${#missing[@]} -gt 0 ]; then
      list=$(IFS=,; echo "${missing[*]}")
      python3 "$root/golden-values/families.py" --bench "$dir" --bench-files "$list" \
        --threads "$(nproc)" $([ -x "$quantizer" ] && echo --quantizer "$quantizer")
    fi
    if [ "${MOE:-0}" = 1 ]; then
      if [ -x "$quantizer" ]; then
        moe=(qwen3moe-a3b-4l-q4_k_m gpt-oss-20b-2l-mxfp4)
        if [ ! -s "$dir/bench-${moe[0]}.gguf" ] || [ ! -s "$dir/bench-${moe[1]}.gguf" ]; then
          python3 "$root/golden-values/families.py" --bench-moe "$dir" --threads "$(nproc)" \
            --quantizer "$quantizer"
        fi
        files+=("${moe[@]}")
      else
        echo "no llama-quantize at $quantizer: the mixtures (MOE=1) are left out" >&2
      fi
    fi
    for m in "${files[@]}"; do
      peer=$m
      [ "$m" = falcon3b-i2s ] && peer=
      runs+=("$m|$dir/bench-$m.gguf|$peer")
      if $cores && [[ $m == llama1b-q* ]]; then
        runs+=("$m-shader-cores|$dir/bench-$m.gguf|$m|--gpu-matrix-cores off")
      fi
    done
  fi
fi

: >"$out/pairs.txt"
for round in $(seq "$rounds"); do
  for r in "${runs[@]}"; do
    IFS='|' read -r name file peer flags <<<"$r"
    [ "$round" -gt 1 ] && [ -z "$peer" ] && continue  # nothing to compare with: one round
    step "round $round: hesper-rs bench --backend gpu, $name"
    # shellcheck disable=SC2086  # the run's own flags, word by word
    "$bin" bench -m "$file" --backend gpu -p "$pp" -n "$tg" -r "$reps" --roofline --json $flags \
      >"$out/hesper-$name-r$round.json"
    [ "$round" = 1 ] && [ -n "$peer" ] && echo "$name $peer" >>"$out/pairs.txt"
    if ! $smoke && [ "$peer" = "$name" ] && [ -x "$llama" ]; then
      step "round $round: llama.cpp llama-bench (Vulkan), $name"
      "$llama" -m "$file" -ngl 99 -p "$pp" -n "$tg" -r "$reps" -o json \
        >"$out/llama-vulkan-$name-r$round.json" 2>"$out/llama-vulkan-$name-r$round.log" ||
        echo "llama-bench failed: see llama-vulkan-$name-r$round.log" >&2
    fi
  done
done

step "summary"
python3 "$root/benches/gpu_summary.py" "$out" | tee "$out/summary.md"
step "done"
