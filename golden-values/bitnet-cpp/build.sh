#!/usr/bin/env bash
# Builds bitnet.cpp (microsoft/BitNet with its llama.cpp fork, at pinned commits) and dump.cpp
# against it, twice: as published (its `bitnet` graph computes SiLU) and with the FFN activation
# of that graph switched to ReLU² (one token, what the official 2B4T model was trained with and
# what bitnet.cpp's later `build_bitnet_158` computes). Both builds admit an F32 V cache (a
# guard relaxed, below); no arithmetic is changed. Sources and builds stay in WORK_DIR.
#
#   bash build.sh [WORK_DIR]          (default /tmp/hesper-bitnet-cpp; ~10 min on 2 cores)
#
# Produces WORK_DIR/dump-silu and WORK_DIR/dump-relu2. Sources come from GitHub unless
# BITNET_GIT / LLAMA_GIT name local git directories holding the pinned commits.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=${1:-/tmp/hesper-bitnet-cpp}
bitnet_git=${BITNET_GIT:-https://github.com/microsoft/BitNet}
llama_git=${LLAMA_GIT:-https://github.com/Eddie-Wang1120/llama.cpp}
# BitNet's last commit whose 3rdparty/llama.cpp submodule is 406a5036 (Oct-Nov 2024: x86 I2_S
# kernels in src/ggml-bitnet-mad.cpp, per-token int8 activations in the fork's ggml). The later
# pins (a8ac7072 ... 390c3077) are not published in the fork's repository.
bitnet_commit=4645960add917c8284ad05eebedca31f8848d45d
llama_commit=406a5036f9a8aaee9ec5e96e652f61691340fe95

mkdir -p "$work"
fetch() { # URL_OR_DIR COMMIT DEST: the commit's tree, without the large model files
  local src=$1 commit=$2 dest=$3 git_dir
  if [ -d "$src" ]; then git_dir=$src; else
    git_dir=$work/$(basename "$src").git
    [ -d "$git_dir" ] || git clone -q --bare "$src" "$git_dir"
  fi
  mkdir -p "$dest"
  local top ex
  top=$(git -C "$git_dir" ls-tree --name-only "$commit" | grep -vx 'models\|examples' || true)
  # shellcheck disable=SC2086
  git -C "$git_dir" archive "$commit" $top | tar -x -C "$dest"
  if git -C "$git_dir" ls-tree "$commit" examples >/dev/null 2>&1; then
    ex=$(git -C "$git_dir" ls-tree --name-only "$commit:examples" 2>/dev/null | grep -vx server |
      sed 's|^|examples/|' || true)
    # shellcheck disable=SC2086
    [ -z "$ex" ] || git -C "$git_dir" archive "$commit" $ex | tar -x -C "$dest"
  fi
}

for act in silu relu2; do
  src=$work/src-$act
  if [ ! -d "$src" ]; then
    fetch "$bitnet_git" "$bitnet_commit" "$src"
    rm -rf "$src/3rdparty/llama.cpp"
    fetch "$llama_git" "$llama_commit" "$src/3rdparty/llama.cpp"
    : > "$src/include/bitnet-lut-kernels.h"    # only the TL1/TL2 lookup-table kernels use it
    # An F32 V cache: this fork demands flash attention for any V type but F16, and its flash
    # kernel cannot read an F32 K. The guard is for quantized V (the plain path stores V
    # transposed, which F32 allows, as later llama.cpp does), so it is relaxed for F32.
    python3 - "$src/3rdparty/llama.cpp/src/llama.cpp" <<'EOF'
import sys
path = sys.argv[1]
text = open(path).read()
guard = "if (params.type_v != GGML_TYPE_F16 && !params.flash_attn) {"
assert text.count(guard) == 1, "unexpected V cache guard"
text = text.replace(guard, "if (params.type_v != GGML_TYPE_F16 && params.type_v != GGML_TYPE_F32 "
                    "&& !params.flash_attn) {")
open(path, "w").write(text)
EOF
    if [ "$act" = relu2 ]; then
      python3 - "$src/3rdparty/llama.cpp/src/llama.cpp" <<'EOF'
import sys
path = sys.argv[1]
text = open(path).read()
start = text.index("struct ggml_cgraph * build_bitnet() {")
end = text.index("struct ggml_cgraph * build_", start + 10)
body = text[start:end]
assert body.count("LLM_FFN_SILU, LLM_FFN_PAR") == 1, "unexpected build_bitnet"
text = text[:start] + body.replace("LLM_FFN_SILU, LLM_FFN_PAR", "LLM_FFN_RELU_SQR, LLM_FFN_PAR") + text[end:]
open(path, "w").write(text)
EOF
    fi
  fi
  build=$work/build-$act
  cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DGGML_OPENMP=OFF > "$work/cmake-$act.log"
  cmake --build "$build" --target llama -j 2 > "$work/build-$act.log"
  inc=$src/3rdparty/llama.cpp
  g++ -O2 -std=c++17 -march=native "$here/dump.cpp" -I "$inc/include" -I "$inc/ggml/include" \
    "$(find "$build" -name libllama.a | head -1)" "$(find "$build" -name libggml.a | head -1)" \
    -lpthread -lm -o "$work/dump-$act"
  echo "built $work/dump-$act"
done
