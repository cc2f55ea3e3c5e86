#!/usr/bin/env python3
"""Golden values for the model families beside BitNet: tiny synthetic `llama`, `qwen2`, `qwen3`,
`qwen3moe`, `gemma2`, `gemma3`, `phi3` and `gpt-oss` GGUF files and llama.cpp's logits and residual streams for them.

Steps (positional; default both):

  models   Write the tiny models to models/:
             tiny-llama-f16     arch llama, F16 projections, tied F16 embedding, rope_freqs
                                (Llama 3.1's per-pair frequency divisors), GQA 4/2
             tiny-llama-q8_0    the same values quantized to Q8_0 (gguf-py's quantizer), with an
                                untied Q8_0 output.weight
             tiny-qwen2-f16     arch qwen2: F16 projections with F32 Q/K/V biases, NeoX RoPE
             tiny-qwen3-f16     arch qwen3 in Qwen3's head geometry: heads of 128 over n_embd
                                256 (Q twice as wide), GQA 4/2, theta 1e6, eps 1e-6, each head's
                                Q and K RMS-normalized (attn_q_norm, attn_k_norm: gains spread
                                over 0.5-3 so that a graph without them is far off), YaRN RoPE
                                scaling (factor 4 over an original 32768 positions, as Qwen3's
                                128K files), tied F16 embedding
             tiny-qwen3moe-f16  arch qwen3moe: tiny-qwen3-f16's attention, and a mixture of 8
                                experts of n_ff 256 for the FFN, 2 used per token (an F32
                                router, F16 experts stacked [cols, rows, 8])
             tiny-gemma3-f16    arch gemma3 in Gemma 3 1B's proportions: heads of 128 over n_embd
                                256, one kv head, six layers of which the first five attend a
                                sliding window of 5 positions (RoPE theta 10000 there, 1e6 on
                                the sixth, whose positions alone are scaled by 1/8: the 4B-27B
                                files' linear scaling), Q/K head norms, norms after attention
                                and after the FFN, GELU (tanh), the embedding scaled by
                                sqrt(256), tied F16
             tiny-gemma2-f16    arch gemma2: Gemma 3's graph without head norms, four layers
                                of which the even ones attend a sliding window of 5 positions
                                (one RoPE base, 1e4), the attention scores soft-capped at 5
                                (Gemma 2's 50 would not show at this size) and the logits at 30
             tiny-phi3-f16      arch phi3 in Phi-4-mini's proportions: Q, K and V in one
                                attn_qkv tensor, gate and up in one ffn_up of 2*n_ff rows, GQA
                                4/2 of heads of 64, RoPE on 48 of each head's 64 dims (NeoX
                                pairs) with LongRoPE's factors (rope_factors_short 1-2.5,
                                rope_factors_long 1-40, rope.scaling.attn_factor 1.19, original
                                context 256 = n_ctx, so llama.cpp rotates with the short ones),
                                tied F16 embedding
             tiny-mixtral-f16   arch llama in Mixtral's form: Mistral's attention (GQA 4/1,
                                theta 1e6, untied head) and 8 experts of feed_forward_length
                                256, 2 used per token, named by expert_count alone (an F32
                                router, F16 experts stacked [cols, rows, 8])
             tiny-gpt-oss-f16   arch gpt-oss in gpt-oss-20b's proportions: heads of 64 over
                                n_embd 256 (Q twice as wide), GQA 8/2, Q/K/V and output biases,
                                a learned attention sink per head, a sliding window of 5 on
                                layer 0 of 2 (gpt-oss: 128 on every other layer), theta 150000
                                with YaRN (factor 32 over an original 4096 positions), the norm
                                before the FFN named post_attention_norm, 8 experts of n_ff 256
                                with 4 used (top-k of the biased router's logits, softmax over
                                those), every expert's gate, up and down biased, gate and up
                                spread to std ~4 so that the clamped SwiGLU (limit 7) clamps,
                                untied F16 head
             tiny-falcon3-f16   arch llama in Falcon3's head geometry: head width 256 named by
                                attention.key_length (Q 512 wide over n_embd 256), GQA 2/1,
                                theta 1000042, untied F16 output.weight; ternary values t*beta
                                stored as F16 (what a 1.58-bit Falcon3 file holds as I2_S codes)
             tiny-mistral-f32   arch llama in Mistral 7B's proportions (GQA 4/1, theta 1e6, no
                                rope_freqs), F32 projections and an untied F32 output.weight,
                                a SentencePiece vocabulary (SPM_VOCAB's first 512 pieces)
             tiny-llama-tq1_0   tiny-llama-f16's geometry with ternary TQ1_0 projections
             tiny-qwen2-tq2_0   tiny-qwen2-f16's with ternary TQ2_0 projections and an untied F16
                                output.weight
             tiny-falcon3-i2s   the same codes with beta as f32 in bitnet.cpp's I2_S (a Falcon3
                                1.58-bit file), untied F16 output.weight
           then tiny-llama-f16 through llama.cpp's own quantizer (llama_model_quantize, what
           llama-quantize runs; no importance matrix) into the types people download:
             tiny-llama-q4_0, -q4_k_m, -q5_k_m, -q6_k, -bf16 (the file types of those names,
             with llama.cpp's choice of type per tensor: Q6_K for the tied embedding, Q6_K
             for some attn_v and ffn_down tensors of a _M mix), and tiny-mistral-f32 into
             tiny-mistral-q4_k_m (untied: a Q4_K token_embd, a Q6_K output.weight), and
             tiny-qwen3moe-f16 into tiny-qwen3moe-q4_k_m (stacked Q4_K and Q6_K experts, Q8_0
             attn_v and Q5_K attn_output as llama.cpp mixes a mixture of experts, the router
             kept F32), tiny-gpt-oss-f16 into tiny-gpt-oss-mxfp4 (MXFP4_MOE, as gpt-oss is
             published: MXFP4 experts, Q8_0 for the other matrices), and tiny-falcon3-f16 into
             tiny-falcon3-q4_k_m (K-quants under heads of 256: a head's output is one Q8_K
             block)
  llama    Run llama.cpp (generate.py's LlamaCpp: CPU, flash attention off, F32 KV cache, one
           ubatch) on each model but the I2_S one and the three token sequences of
           generate.py (a SentencePiece model also SPM_TEXT as llama.cpp tokenizes it); write
           out/<stem>.json with logits and every layer's l_out, in generate.py's format.
  bitnet   (not in the default run) Run tiny-falcon3-i2s through bitnet.cpp's `llama` graph
           (bitnet-cpp/build.sh's dump-silu in --bitnet-cpp) into out/tiny-falcon3-i2s.json.
  validate (not in the default run) Compare bitnet.cpp's golden of tiny-falcon3-i2s with the
           exact model in float64 and with a known-wrong scheme (llama.cpp's f16 activations
           on tiny-falcon3-f16) → out/families-validation.txt: what its test bound is set from.

Every tensor draws from its own stream (generate.py's tensor_rng, seed 20261122), so the files
are reproduced byte for byte. Requirements as generate.py (numpy, gguf==0.19.0; the llama step
needs llama-cpp-python 0.3.36, or its package pointed at a libllama build of llama.cpp
0c1e57098 through a lib/ folder).
"""
from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from generate import (GGML_F16, GGML_F32, GGML_I2_S, GGML_Q8_0, GGML_TQ1_0, GGML_TQ2_0,
                      GGUF_F32, GGUF_I32, GGUF_STR, KV, MODELS_DIR, ROOT, SEED, TINY, GGUFFile,
                      GGUFStreamWriter, HParams, LlamaCpp, TensorInfo, gen_norm, kv_arr, kv_bool,
                      kv_f32, kv_str, kv_u32, pack_i2s, pack_q8_0, pack_tq1_0, pack_tq2_0, shape_kvs,
                      tensor_rng, token_sequences, write_outputs)

# llama.cpp's llama_ftype of a file whose projections are of the type
LLAMA_FTYPE = {GGML_F32: 0, GGML_F16: 1, GGML_Q8_0: 7, GGML_TQ1_0: 36, GGML_TQ2_0: 37,
               GGML_I2_S: 40}
# Types whose projections hold ternary codes and whose head is F16 (as the published files)
TERNARY_TYPES = (GGML_TQ1_0, GGML_TQ2_0, GGML_I2_S)
TQ_PACKERS = {GGML_TQ1_0: pack_tq1_0, GGML_TQ2_0: pack_tq2_0}
# The SentencePiece vocabulary of the Mistral-shaped model: llama.cpp's llama-spm test
# vocabulary (LLaMA 1/2's and Mistral 7B's 32000 pieces), its first 512 pieces (control tokens,
# the 256 byte tokens, then the highest-scoring merges)
SPM_VOCAB = ROOT / "tokenizer" / "ggml-vocab-llama-spm.gguf"
# The text each SentencePiece model also runs, tokenized by llama.cpp (BOS added): spaces,
# digits, punctuation, a newline and characters that only byte fallback can spell
SPM_TEXT = "And it came to pass, in 1611: the naïve café's ☕ tea\nthen\tmore  spaces!"


@dataclass(frozen=True)
class Family:
    """One tiny model: its architecture, shape and storage."""
    stem: str
    arch: str
    hp: HParams
    head_dim: int               # attention.key_length when it differs from n_embd / n_head
    weight_type: int            # GGML_F16, GGML_Q8_0 or GGML_I2_S
    untied: bool                # an output.weight of weight_type
    biases: bool                # Q/K/V biases (qwen2)
    rope_freqs: bool            # a rope_freqs.weight tensor (Llama 3.1)
    ternary: bool               # projections hold t*beta (Falcon3's 1.58-bit values)
    spm: bool = False           # a SentencePiece vocabulary (SPM_VOCAB) instead of ids only
    qk_norm: bool = False       # each head's Q and K RMS-normalized (qwen3, gemma3)
    window: int = 0             # attention.sliding_window (gemma3: five layers of six)
    experts: tuple[int, int, int] | None = None  # (count, used, each one's n_ff): qwen3moe
    rope_dim: int = 0           # rope.dimension_count when RoPE turns only part of a head
    yarn: tuple[float, int] | None = None  # YaRN's (factor, original context): Qwen3's 128K files

    @property
    def oss(self) -> bool:
        """gpt-oss's graph: biases on every product, attention sinks, a clamped SwiGLU."""
        return self.arch == "gpt-oss"

    @property
    def fused(self) -> bool:
        """Phi-3's tensors: Q, K and V in one attn_qkv, gate and up in one ffn_up (gate first)."""
        return self.arch == "phi3"

    @property
    def longrope(self) -> bool:
        """Phi-3.5's and Phi-4-mini's LongRoPE factors and attention factor."""
        return self.arch == "phi3"

    @property
    def path(self) -> Path:
        return MODELS_DIR / f"{self.stem}.gguf"

    @property
    def gemma(self) -> bool:
        """Gemma's graph: post-norms, the embedding times sqrt(n_embd), GELU."""
        return self.arch in ("gemma2", "gemma3")

    # write_outputs() reads these from a generate.py Variant
    @property
    def activation(self) -> str:
        return "gelu" if self.gemma else "silu"

    @property
    def act_quant(self) -> str:
        return {GGML_F32: "none", GGML_F16: "f16", GGML_Q8_0: "q8_0", GGML_TQ1_0: "q8_k",
                GGML_TQ2_0: "q8_k", GGML_I2_S: "per_token_i8"}[self.weight_type]

    @property
    def head_type(self) -> int:
        """An untied output.weight's type: F16 beside ternary projections (as Falcon3's files)."""
        return GGML_F16 if self.weight_type in TERNARY_TYPES else self.weight_type

    def projections(self) -> list[tuple[str, int, int]]:
        """(name, rows, cols) of a layer's projections."""
        E, F = self.hp.n_embd, self.hp.n_ff
        Q, KV_ = self.hp.n_head * self.head_dim, self.hp.n_head_kv * self.head_dim
        attention = [("attn_q", Q, E), ("attn_k", KV_, E), ("attn_v", KV_, E),
                     ("attn_output", E, Q)]
        if self.fused:
            return [("attn_qkv", Q + 2 * KV_, E), ("attn_output", E, Q), ("ffn_up", 2 * F, E),
                    ("ffn_down", E, F)]
        if self.experts:        # the FFN is the experts' (expert_tensors)
            return attention
        return attention + [("ffn_gate", F, E), ("ffn_up", F, E), ("ffn_down", E, F)]


FALCON3 = HParams(n_vocab=512, n_embd=256, n_ff=512, n_head=2, n_head_kv=1, n_layer=2, n_ctx=256,
                  rope_base=1000042.0)
# Mistral 7B's proportions: GQA 4/1, theta 1e6, an untied head, no rope_freqs
MISTRAL = HParams(n_vocab=512, n_embd=256, n_ff=512, n_head=4, n_head_kv=1, n_layer=2, n_ctx=256,
                  rope_base=1e6)
# Mixtral 8x7B's: Mistral's, each expert's FFN (and feed_forward_length) 256 wide here
MIXTRAL = HParams(n_vocab=512, n_embd=256, n_ff=256, n_head=4, n_head_kv=1, n_layer=2, n_ctx=256,
                  rope_base=1e6)
# Qwen3's geometry: heads of 128 whatever n_embd (Q wider than the residual stream), theta 1e6,
# eps 1e-6
QWEN3 = HParams(n_vocab=512, n_embd=256, n_ff=512, n_head=4, n_head_kv=2, n_layer=2, n_ctx=256,
                rope_base=1e6, eps=1e-6)
# Gemma 3 1B's proportions: heads of 256 named by key_length over a narrower stream (here 128
# over 256), one kv head, theta 1e6 on the global layers (the sliding-window layers' 10000 is
# llama.cpp's default, as Gemma 3 files leave rope.freq_base_swa out), eps 1e-6, six layers so
# that the default pattern (five windowed, then one global) holds once
GEMMA3 = HParams(n_vocab=512, n_embd=256, n_ff=512, n_head=4, n_head_kv=1, n_layer=6, n_ctx=256,
                 rope_base=1e6, eps=1e-6)
# Gemma 2 2B's proportions: heads of 256 over 2304 (here 128 over 256), GQA 2/1, theta 1e4,
# four layers so that the window pattern (even layers windowed) holds twice
GEMMA2 = HParams(n_vocab=512, n_embd=256, n_ff=512, n_head=4, n_head_kv=2, n_layer=4, n_ctx=256,
                 rope_base=1e4, eps=1e-6)
# gpt-oss-20b's proportions: heads of 64 over a narrower stream (Q 512 over 256), GQA 8/2 (4
# query heads a kv head, as its 64/8), theta 150000, two layers: the first windowed
GPT_OSS = HParams(n_vocab=512, n_embd=256, n_ff=256, n_head=8, n_head_kv=2, n_layer=2, n_ctx=256,
                  rope_base=150000.0)
# Phi-4-mini's proportions: GQA 3/1 (here 4/2), RoPE over three quarters of each head
PHI3 = HParams(n_vocab=512, n_embd=256, n_ff=512, n_head=4, n_head_kv=2, n_layer=2, n_ctx=256)
FAMILIES = [
    Family("tiny-llama-f16", "llama", TINY, 64, GGML_F16, False, False, True, False),
    Family("tiny-llama-q8_0", "llama", TINY, 64, GGML_Q8_0, True, False, True, False),
    Family("tiny-qwen2-f16", "qwen2", TINY, 64, GGML_F16, False, True, False, False),
    Family("tiny-falcon3-f16", "llama", FALCON3, 256, GGML_F16, True, False, False, True),
    Family("tiny-mistral-f32", "llama", MISTRAL, 64, GGML_F32, True, False, False, False,
           spm=True),
    Family("tiny-llama-tq1_0", "llama", TINY, 64, GGML_TQ1_0, False, False, True, True),
    Family("tiny-qwen2-tq2_0", "qwen2", TINY, 64, GGML_TQ2_0, True, True, False, True),
    # Qwen3's 128K files: YaRN, 4 × its original 32768 positions
    Family("tiny-qwen3-f16", "qwen3", QWEN3, 128, GGML_F16, False, False, False, False,
           qk_norm=True, yarn=(4.0, 32768)),
    # Qwen3-30B-A3B's routing (softmax, the best of 128 renormalized) with 8 experts, 2 used
    Family("tiny-qwen3moe-f16", "qwen3moe", QWEN3, 128, GGML_F16, False, False, False, False,
           qk_norm=True, experts=(8, 2, 256)),
    # A window of 5 positions: every sequence (7, 16, 33 tokens) reaches past it
    Family("tiny-gemma3-f16", "gemma3", GEMMA3, 128, GGML_F16, False, False, False, False,
           qk_norm=True, window=5),
    # Gemma 2's window on every other layer, its scores and logits soft-capped
    Family("tiny-gemma2-f16", "gemma2", GEMMA2, 128, GGML_F16, False, False, False, False,
           window=5),
    Family("tiny-phi3-f16", "phi3", PHI3, 64, GGML_F16, False, False, False, False, rope_dim=48),
    # Mixtral's: Mistral's graph (arch llama, untied) with 8 experts, 2 used
    Family("tiny-mixtral-f16", "llama", MIXTRAL, 64, GGML_F16, True, False, False, False,
           experts=(8, 2, 256)),
    # gpt-oss: biases, sinks, a window of 5 on every other layer, YaRN, 8 experts of which 4
    Family("tiny-gpt-oss-f16", "gpt-oss", GPT_OSS, 64, GGML_F16, True, True, False, False,
           window=5, experts=(8, 4, 256), yarn=(32.0, 4096)),
]


@dataclass(frozen=True)
class Quantized:
    """A file llama.cpp's quantizer makes from a Family's file."""
    stem: str
    source: Family
    ftype: int                  # llama_ftype (LLAMA_FTYPE_MOSTLY_*)
    act_quant: str              # how llama.cpp quantizes the inputs of most of its products

    @property
    def path(self) -> Path:
        return MODELS_DIR / f"{self.stem}.gguf"

    @property
    def hp(self) -> HParams:
        return self.source.hp

    @property
    def activation(self) -> str:
        return self.source.activation

    spm = False


QUANTIZED = [
    Quantized("tiny-llama-q4_0", FAMILIES[0], 2, "q8_0"),
    Quantized("tiny-llama-q4_k_m", FAMILIES[0], 15, "q8_k"),
    Quantized("tiny-llama-q5_k_m", FAMILIES[0], 17, "q8_k"),
    Quantized("tiny-llama-q6_k", FAMILIES[0], 18, "q8_k"),
    Quantized("tiny-llama-bf16", FAMILIES[0], 32, "bf16"),
    # Untied, as Llama 3.1 8B's Q4_K_M: a Q4_K token_embd beside a Q6_K output.weight
    Quantized("tiny-mistral-q4_k_m", FAMILIES[4], 15, "q8_k"),
    # Qwen3-30B-A3B's Q4_K_M: stacked Q4_K and Q6_K experts beside the F32 router
    Quantized("tiny-qwen3moe-q4_k_m", FAMILIES[8], 15, "q8_k"),
    # gpt-oss as published: MXFP4 experts (MXFP4_MOE), Q8_0 for every other matrix
    Quantized("tiny-gpt-oss-mxfp4", FAMILIES[13], 38, "q8_0"),
    # Falcon3's Q4_K_M: heads of 256, each one Q8_K block of attention's output
    Quantized("tiny-falcon3-q4_k_m", FAMILIES[3], 15, "q8_k"),
]


def quantize(q: Quantized, threads: int, src: Path | None = None, dst: Path | None = None,
             quantizer: Path | None = None) -> None:
    """q.source's file (or src) through llama.cpp's quantizer into q.path (or dst): the Python
    binding's llama_model_quantize, or the `llama-quantize` program at `quantizer` (a GPU machine
    has no llama_cpp package)."""
    import ctypes
    import subprocess
    src, dst = src or q.source.path, dst or q.path
    if quantizer is not None:
        cmd = [str(quantizer), str(src), str(dst), str(q.ftype), str(threads)]
        if subprocess.run(cmd, stdout=subprocess.DEVNULL).returncode != 0:
            raise SystemExit(f"{quantizer} failed on {q.stem}")
    else:
        import llama_cpp
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype, params.nthread = q.ftype, threads
        rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(),
                                            ctypes.byref(params))
        if rc != 0:
            raise SystemExit(f"llama_model_quantize failed on {q.stem}: {rc}")
    print(f"wrote {dst} ({dst.stat().st_size} B)")


# The same codes as tiny-falcon3-f16 with beta as f32 in bitnet.cpp's I2_S: what a Falcon3
# 1.58-bit file holds. llama.cpp cannot read I2_S; bitnet.cpp computes its golden (`bitnet` step).
FALCON3_I2S = Family("tiny-falcon3-i2s", "llama", FALCON3, 256, GGML_I2_S, True, False, False,
                     True)


def ternary(seed: int, name: str, rows: int, cols: int) -> tuple[np.ndarray, float]:
    """Ternary codes t in {-1, 0, 1} [rows, cols] and the scale beta (float64)."""
    rng = tensor_rng(seed, name)
    t = rng.integers(-1, 2, size=(rows, cols))
    return t, rng.uniform(1.0, 2.0) * np.sqrt(1.5 / cols)


def projection(seed: int, f: Family, name: str, rows: int, cols: int,
               dense: bool = False) -> np.ndarray:
    """A projection's values (f16-exact but in F32 files), scaled so that unit-RMS inputs give
    outputs of std ~1. Ternary families (unless `dense`): t*beta16 with t uniform in {-1, 0, 1}."""
    if f.ternary and not dense:
        t, beta = ternary(seed, name, rows, cols)
        return (t.astype(np.float32) * np.float32(np.float16(beta))).astype(np.float16)
    rng = tensor_rng(seed, name)
    dtype = np.float32 if f.weight_type == GGML_F32 else np.float16
    return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(dtype)


def rope_freqs(hp: HParams, head_dim: int) -> np.ndarray:
    """Llama 3.1's divisors shape: 1 for high frequencies, up to 8 for low ones."""
    half = head_dim // 2
    return np.where(np.arange(half) < half // 4, 1.0, np.linspace(1.0, 8.0, half)).astype(np.float32)


def encode(f: Family, w: np.ndarray) -> bytes:
    """A dense matrix in the family's type (its head's, for a ternary family: F16)."""
    if f.head_type == GGML_F32:
        return w.astype(np.float32).tobytes()
    if f.head_type == GGML_F16:
        return w.astype(np.float16).tobytes()
    return pack_q8_0(w)


def tensors(f: Family, seed: int) -> list[tuple[TensorInfo, Callable[[], bytes]]]:
    """Every tensor of `f` in file order, each with what makes its bytes (called once, when it is
    written: a bench-sized model never sits in memory whole)."""
    hp, E = f.hp, f.hp.n_embd
    out: list[tuple[TensorInfo, Callable[[], bytes]]] = []

    def add(name: str, ne: tuple[int, ...], ty: int, make: Callable[[], bytes]) -> None:
        out.append((TensorInfo(name, ne, ty), make))

    # Gemma scales the embedding by sqrt(n_embd) as it enters: half the std, so that the scaled
    # rows (std 2) do not drown the layers' normalized outputs the residual stream adds up
    emb_std = hp.emb_std / 2 if f.gemma else hp.emb_std
    add("token_embd.weight", (E, hp.n_vocab), GGML_F16, lambda: (
        emb_std * tensor_rng(seed, "token_embd.0").standard_normal((hp.n_vocab, E))
    ).astype(np.float16).tobytes())
    add("output_norm.weight", (E,), GGML_F32,
        lambda: gen_norm(seed, "output_norm.weight", E).tobytes())
    if f.untied:
        add("output.weight", (E, hp.n_vocab), f.head_type, lambda: encode(
            f, projection(seed, f, "output.weight", hp.n_vocab, E, dense=True) * np.float16(4.0)))
    if f.rope_freqs:
        add("rope_freqs.weight", (f.head_dim // 2,), GGML_F32,
            lambda: rope_freqs(hp, f.head_dim).tobytes())
    if f.longrope:  # LongRoPE's divisors: short ones near 1, long ones up to 40 (Phi-4-mini's)
        half = f.rope_dim // 2
        for name, top in (("rope_factors_long", 40.0), ("rope_factors_short", 2.5)):
            add(name + ".weight", (half,), GGML_F32, lambda name=name, top=top: np.sort(
                tensor_rng(seed, name).uniform(1.0, top, half)).astype(np.float32).tobytes())
    for il in range(hp.n_layer):
        p = f"blk.{il}."
        add(p + "attn_norm.weight", (E,), GGML_F32,
            lambda p=p: gen_norm(seed, p + "attn_norm.weight", E).tobytes())
        for name, rows, cols in f.projections():
            w = p + name + ".weight"
            if f.weight_type == GGML_I2_S:
                def make(w=w, rows=rows, cols=cols) -> bytes:
                    t, beta = ternary(seed, w, rows, cols)
                    return pack_i2s((t + 1).astype(np.uint8), float(np.float32(beta)))
            elif f.weight_type in TQ_PACKERS:
                def make(w=w, rows=rows, cols=cols) -> bytes:
                    t, beta = ternary(seed, w, rows, cols)    # one f16 scale for every block
                    return TQ_PACKERS[f.weight_type]((t + 1).astype(np.uint8),
                                                     float(np.float16(beta)))
            else:
                def make(w=w, rows=rows, cols=cols) -> bytes:
                    return encode(f, projection(seed, f, w, rows, cols))
            add(w, (cols, rows), f.weight_type, make)
            if f.qk_norm and name in ("attn_q", "attn_k"):
                norm = p + name + "_norm.weight"
                add(norm, (f.head_dim,), GGML_F32, lambda norm=norm: tensor_rng(seed, norm).uniform(
                    0.5, 3.0, f.head_dim).astype(np.float32).tobytes())
            if f.biases and name in ("attn_q", "attn_k", "attn_v"):
                bias = p + name + ".bias"
                add(bias, (rows,), GGML_F32, lambda bias=bias, rows=rows: (
                    0.5 * tensor_rng(seed, bias).standard_normal(rows)).astype(np.float32).tobytes())
            if f.oss and name == "attn_output":
                bias, sinks = p + "attn_output.bias", p + "attn_sinks.weight"
                add(bias, (E,), GGML_F32, lambda bias=bias: (
                    0.5 * tensor_rng(seed, bias).standard_normal(E)).astype(np.float32).tobytes())
                # Sinks around the scores' scale, so that each takes a visible share
                add(sinks, (hp.n_head,), GGML_F32, lambda sinks=sinks: (
                    1.0 + tensor_rng(seed, sinks).standard_normal(hp.n_head)
                ).astype(np.float32).tobytes())
            if name == "attn_output":
                # gpt-oss names its norm before the FFN post_attention_norm
                norm = p + ("post_attention_norm" if f.oss else "ffn_norm") + ".weight"
                add(norm, (E,), GGML_F32,
                    lambda norm=norm: gen_norm(seed, norm, E).tobytes())
            if f.experts and name == "attn_output":
                for info, make in expert_tensors(f, seed, p):
                    out.append((info, make))
            if f.gemma and name in ("attn_output", "ffn_down"):
                norm = p + ("post_attention_norm" if name == "attn_output" else "post_ffw_norm")
                add(norm + ".weight", (E,), GGML_F32,
                    lambda norm=norm: gen_norm(seed, norm + ".weight", E).tobytes())
    return out


def expert_tensors(f: Family, seed: int, p: str) -> list[tuple[TensorInfo, Callable[[], bytes]]]:
    """A mixture-of-experts layer's router (F32, logits of std ~2 so that no two experts tie)
    and its experts' gate, up and down projections stacked `[cols, rows, n_expert]` (F16);
    gpt-oss's also with their biases (F32: the router's `[n_expert]`, the experts'
    `[rows, n_expert]`), its gate and up spread 4 times wider so that its SwiGLU's clamps at
    7 take hold."""
    E = f.hp.n_embd
    n_expert, _, F = f.experts
    router = p + "ffn_gate_inp.weight"
    out = [(TensorInfo(router, (E, n_expert), GGML_F32), lambda: (
        2.0 * tensor_rng(seed, router).standard_normal((n_expert, E)) / np.sqrt(E)
    ).astype(np.float32).tobytes())]

    def bias(name: str, ne: tuple[int, ...]) -> None:
        out.append((TensorInfo(name, ne, GGML_F32), lambda: (
            0.5 * tensor_rng(seed, name).standard_normal(ne[::-1])).astype(np.float32).tobytes()))

    if f.oss:
        bias(p + "ffn_gate_inp.bias", (n_expert,))
    for name, rows, cols in (("ffn_gate_exps", F, E), ("ffn_up_exps", F, E),
                             ("ffn_down_exps", E, F)):
        w = p + name + ".weight"
        spread = 4.0 if f.oss and name != "ffn_down_exps" else 1.0
        out.append((TensorInfo(w, (cols, rows, n_expert), GGML_F16), lambda w=w, rows=rows, cols=cols, spread=spread: (
            spread * tensor_rng(seed, w).standard_normal((n_expert, rows, cols)) / np.sqrt(cols)
        ).astype(np.float16).tobytes()))
        if f.oss:
            bias(p + name + ".bias", (rows, n_expert))
    return out


def write(f: Family, seed: int, path: Path) -> None:
    ts = tensors(f, seed)
    w = GGUFStreamWriter(path, kvs(f), [info for info, _ in ts])
    for info, make in ts:
        data = make()
        assert len(data) == info.nbytes, info.name
        w.write(info.name, data)
    w.close()
    print(f"wrote {path}  {path.stat().st_size:,d} B")


def kvs(f: Family) -> list[KV]:
    A, hp = f.arch, f.hp
    keys = shape_kvs(A, hp, f"hesper-rs {f.stem}", f.rope_dim or f.head_dim)
    if f.head_dim != hp.n_embd // hp.n_head:
        keys += [kv_u32(f"{A}.attention.key_length", f.head_dim),
                 kv_u32(f"{A}.attention.value_length", f.head_dim)]
    if f.window:
        keys += [kv_u32(f"{A}.attention.sliding_window", f.window)]
    if f.yarn:
        factor, n_ctx_orig = f.yarn
        keys += [kv_str(f"{A}.rope.scaling.type", "yarn"),
                 kv_f32(f"{A}.rope.scaling.factor", factor),
                 kv_u32(f"{A}.rope.scaling.original_context_length", n_ctx_orig)]
    if f.arch == "gemma3":     # Gemma 3 4B-27B's positions scaled by 8 (on its global layers)
        keys += [kv_str(f"{A}.rope.scaling.type", "linear"),
                 kv_f32(f"{A}.rope.scaling.factor", 8.0)]
    if f.arch == "gemma2":     # soft caps: Gemma 2's final one, a tight one on the scores
        keys += [kv_f32(f"{A}.attn_logit_softcapping", 5.0),
                 kv_f32(f"{A}.final_logit_softcapping", 30.0)]
    if f.longrope:  # LongRoPE: Phi-4-mini's attn_factor, the short factors up to n_ctx
        keys += [kv_f32(f"{A}.rope.scaling.attn_factor", 1.19),
                 kv_u32(f"{A}.rope.scaling.original_context_length", hp.n_ctx)]
    if f.experts:
        n_expert, n_used, n_ff = f.experts
        keys += [kv_u32(f"{A}.expert_count", n_expert), kv_u32(f"{A}.expert_used_count", n_used)]
        if A == "llama":    # Mixtral's experts are feed_forward_length wide, named once
            assert n_ff == hp.n_ff
        else:
            keys += [kv_u32(f"{A}.expert_feed_forward_length", n_ff)]
    keys += [kv_u32("general.file_type", LLAMA_FTYPE[f.weight_type]),
             kv_u32("general.quantization_version", 2)]
    if f.spm:
        return keys + spm_vocab_kvs(f.hp.n_vocab)
    # bitnet.cpp's llama.cpp fork spells the id-only vocabulary "no_vocab" (later ones "none")
    vocab = "no_vocab" if f.weight_type == GGML_I2_S else "none"
    return keys + [kv_str("tokenizer.ggml.model", vocab)]


def spm_vocab_kvs(n_vocab: int) -> list[KV]:
    """The first `n_vocab` pieces of SPM_VOCAB with their scores and types, its control tokens
    (unknown 0, BOS 1, EOS 2) and BOS added before a prompt, as a Mistral GGUF has them."""
    v = GGUFFile(SPM_VOCAB).kv
    assert v["tokenizer.ggml.model"] == "llama" and (v["tokenizer.ggml.bos_token_id"],
                                                     v["tokenizer.ggml.eos_token_id"]) == (1, 2)
    return [kv_str("tokenizer.ggml.model", "llama"),
            kv_arr("tokenizer.ggml.tokens", GGUF_STR, v["tokenizer.ggml.tokens"][:n_vocab]),
            kv_arr("tokenizer.ggml.scores", GGUF_F32, v["tokenizer.ggml.scores"][:n_vocab]),
            kv_arr("tokenizer.ggml.token_type", GGUF_I32,
                   v["tokenizer.ggml.token_type"][:n_vocab]),
            kv_u32("tokenizer.ggml.bos_token_id", 1), kv_u32("tokenizer.ggml.eos_token_id", 2),
            kv_u32("tokenizer.ggml.unknown_token_id", 0),
            kv_bool("tokenizer.ggml.add_bos_token", True),
            kv_bool("tokenizer.ggml.add_eos_token", False)]


def step_models(seed: int, threads: int) -> None:
    for f in FAMILIES + [FALCON3_I2S]:
        write(f, seed, f.path)
    for q in QUANTIZED:
        quantize(q, threads)


# Speed measurements (`--bench DIR`): Llama 3.2 1B's shape (tied embedding, rope_freqs) in F16
# and Q8_0, and Falcon3-3B's as `llama` + I2_S with an untied F16 head.
LLAMA_1B = HParams(n_vocab=128256, n_embd=2048, n_ff=8192, n_head=32, n_head_kv=8, n_layer=16,
                   n_ctx=4096)
FALCON3_3B = HParams(n_vocab=131072, n_embd=3072, n_ff=9216, n_head=12, n_head_kv=4, n_layer=22,
                     n_ctx=4096, rope_base=1000042.0)
BENCH = [
    Family("bench-llama1b-f16", "llama", LLAMA_1B, 64, GGML_F16, False, False, True, False),
    Family("bench-llama1b-q8_0", "llama", LLAMA_1B, 64, GGML_Q8_0, False, False, True, False),
    Family("bench-falcon3b-i2s", "llama", FALCON3_3B, 256, GGML_I2_S, True, False, False, True),
]


BENCH_QUANTIZED = {"q4_0": 2, "q4_k_m": 15, "q5_k_m": 17, "q6_k": 18}
BENCH_FILES = ([f.stem.removeprefix("bench-") for f in BENCH]
               + [f"llama1b-{n}" for n in BENCH_QUANTIZED])


def step_bench(out_dir: Path, seed: int, threads: int, files: list[str],
               quantizer: Path | None) -> None:
    """The benchmark files named in `files` (BENCH_FILES' names) into out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    source = next(f for f in BENCH if f.stem == "bench-llama1b-f16")
    wanted = [f for f in BENCH if f.stem.removeprefix("bench-") in files]
    if any(f"llama1b-{n}" in files for n in BENCH_QUANTIZED) and source not in wanted:
        wanted.insert(0, source)
    for f in wanted:
        write(f, seed, out_dir / f"{f.stem}.gguf")
    # The Llama-1B-shaped F16 file through llama.cpp's quantizer into the types people download
    for name, ftype in BENCH_QUANTIZED.items():
        if f"llama1b-{name}" in files:
            quantize(Quantized(f"bench-llama1b-{name}", source, ftype, ""), threads,
                     src=out_dir / "bench-llama1b-f16.gguf",
                     dst=out_dir / f"bench-llama1b-{name}.gguf", quantizer=quantizer)


# Qwen3-30B-A3B's shape (n_embd 2048, heads 32/4 of 128, 128 experts of n_ff 768, 8 used, its
# vocabulary) cut to its first 4 layers of 48 (`--bench-moe DIR`): a layer as the full model's,
# in a file of 4.9 GB (F16) and 1.5 GB (llama.cpp's Q4_K_M of it)
QWEN3_30B_A3B_4L = HParams(n_vocab=151936, n_embd=2048, n_ff=6144, n_head=32, n_head_kv=4,
                           n_layer=4, n_ctx=4096, rope_base=1e6, eps=1e-6)
BENCH_MOE = Family("bench-qwen3moe-a3b-4l-f16", "qwen3moe", QWEN3_30B_A3B_4L, 128, GGML_F16,
                   True, False, False, False, qk_norm=True, experts=(128, 8, 768))


# gpt-oss-20b's shape (n_embd 2880, heads 64/8 of 64, 32 experts of n_ff 2880, 4 used, window
# 128 on every other layer, YaRN, its 201 088-token vocabulary, untied) cut to its first 2
# layers of 24 (one windowed, one global): 5.5 GB (F16), then llama.cpp's MXFP4_MOE of it
# (MXFP4 experts, Q8_0 elsewhere, as gpt-oss is published: 2.1 GB)
GPT_OSS_20B_2L = HParams(n_vocab=201088, n_embd=2880, n_ff=2880, n_head=64, n_head_kv=8,
                         n_layer=2, n_ctx=4096, rope_base=150000.0)
BENCH_OSS = Family("bench-gpt-oss-20b-2l-f16", "gpt-oss", GPT_OSS_20B_2L, 64, GGML_F16, True,
                   True, False, False, window=128, experts=(32, 4, 2880), yarn=(32.0, 4096))


def step_bench_moe(out_dir: Path, seed: int, threads: int, quantizer: Path | None) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    for source, ftype, name in ((BENCH_MOE, 15, "bench-qwen3moe-a3b-4l-q4_k_m"),
                                (BENCH_OSS, 38, "bench-gpt-oss-20b-2l-mxfp4")):
        src = out_dir / f"{source.stem}.gguf"
        write(source, seed, src)
        quantize(Quantized(name, source, ftype, ""), threads, src=src,
                 dst=out_dir / f"{name}.gguf", quantizer=quantizer)


def step_llama(threads: int) -> None:
    llama = LlamaCpp(threads)
    for f in FAMILIES + QUANTIZED:
        t0 = time.time()
        # llama.cpp sizes the context from hp.n_ctx and checks n_vocab; the residual stream is
        # n_embd wide whatever the head width. A SentencePiece model also runs SPM_TEXT as
        # llama.cpp tokenizes it.
        seqs = token_sequences(f.hp)
        extras = [{} for _ in seqs]
        if f.spm:
            toks, detokenized = llama.tokenize(f.path, SPM_TEXT)
            seqs.append(toks)
            extras.append({"text": SPM_TEXT, "detokenized": detokenized})
        results = [(toks, *llama.run(f.path, f.hp, toks)[:2]) for toks in seqs]
        write_outputs(f, f.hp, llama.description(), results, extras)
        print(f"  {f.stem}: llama.cpp {time.time() - t0:.1f} s")


def step_bitnet(work: Path) -> None:
    """tiny-falcon3-i2s through bitnet.cpp's `llama` graph (bitnet-cpp/build.sh's dump-silu)."""
    import sys
    sys.path.insert(0, str(ROOT / "bitnet-cpp"))
    import run as bitnet                                       # bitnet-cpp/run.py
    f, results = FALCON3_I2S, []
    for toks in token_sequences(f.hp):
        logits, t = bitnet.dump(work / "dump-silu", f.path, toks)
        hidden = np.stack([bitnet.one(t, f"l_out-{il}", ("ADD",)) for il in range(f.hp.n_layer)])
        results.append((toks, logits, hidden))
    write_outputs(f, f.hp, bitnet.SOURCE.replace("KV cache F32 (a guard relaxed to admit F32 V)",
                                                 "KV cache F32") + "; its `llama` graph",
                  results)


def reference_falcon3_i2s(f, toks: list[int]) -> np.ndarray:
    """The exact model of tiny-falcon3-i2s in float64: llama graph, adjacent-pair RoPE, per-token
    int8 activations (absmax, ties to even, as bitnet.cpp), SiLU, untied F16 head unrounded."""
    hp, hd = FALCON3, FALCON3_I2S.head_dim
    n, half = len(toks), hd // 2

    def rms(x, g):
        return x / np.sqrt((x * x).mean(axis=1, keepdims=True) + hp.eps) * g

    def lin(name, x):
        t, beta = f.ternary_i2s(name)
        s = 127.0 / np.maximum(np.abs(x).max(axis=1, keepdims=True), 1e-5)
        return (np.clip(np.round(x * s), -128, 127) @ t.T.astype(np.float64)) * float(beta) / s

    def rope(x, heads):
        x = x.reshape(n, heads, hd).copy()
        angle = np.arange(n)[:, None] * hp.rope_base ** (-np.arange(half) * 2 / hd)
        c, s = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
        a, b = x[..., 0::2].copy(), x[..., 1::2].copy()
        x[..., 0::2], x[..., 1::2] = a * c - b * s, a * s + b * c
        return x

    x = f.array("token_embd.weight")[toks]
    for il in range(hp.n_layer):
        p = f"blk.{il}."
        h = rms(x, f.array(p + "attn_norm.weight"))
        q, k = rope(lin(p + "attn_q.weight", h), hp.n_head), rope(lin(p + "attn_k.weight", h), 1)
        v = lin(p + "attn_v.weight", h)
        att = np.zeros((n, hp.n_head, hd))
        for head in range(hp.n_head):
            scores = q[:, head] @ k[:, 0].T / np.sqrt(hd) + np.triu(np.full((n, n), -np.inf), 1)
            w = np.exp(scores - scores.max(1, keepdims=True))
            att[:, head] = (w / w.sum(1, keepdims=True)) @ v
        x = x + lin(p + "attn_output.weight", att.reshape(n, -1))
        h = rms(x, f.array(p + "ffn_norm.weight"))
        g, u = lin(p + "ffn_gate.weight", h), lin(p + "ffn_up.weight", h)
        x = x + lin(p + "ffn_down.weight", g / (1 + np.exp(-g)) * u)
    return rms(x, f.array("output_norm.weight")) @ f.array("output.weight").T


def step_validate() -> None:
    """How far an exact computation and a known-wrong scheme are from bitnet.cpp's golden of
    tiny-falcon3-i2s (what the tests' bound for it is set from) → out/families-validation.txt."""
    import generate as G
    f = G.GGUFFile(FALCON3_I2S.path)
    _, gold = G.read_outputs(FALCON3_I2S.stem)
    _, twin = G.read_outputs("tiny-falcon3-f16")

    def agree(a, b):
        c = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
        same = int((a.argmax(1) == b.argmax(1)).sum())
        return f"max|dlogit| {np.abs(a - b).max():.3e}, min cosine {c.min():.7f}, argmax {same}/{len(a)}"

    lines = ["tiny-falcon3-i2s: bitnet.cpp's logits against", ""]
    for i, toks in enumerate(token_sequences(FALCON3)):
        lines.append(f"s{i} float64 exact model (int8, ties to even): "
                     f"{agree(reference_falcon3_i2s(f, toks), gold[i][0])}")
        lines.append(f"s{i} llama.cpp on tiny-falcon3-f16 (f16 activations, known wrong): "
                     f"{agree(twin[i][0], gold[i][0])}")
    (ROOT / "out" / "families-validation.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("steps", nargs="*", metavar="STEP",
                    help="models, llama (default: both), bitnet, validate")
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--threads", type=int, default=2, help="llama.cpp threads (default 2)")
    ap.add_argument("--bench", metavar="DIR", type=Path,
                    help="write the benchmark models (Llama-3.2-1B-shaped F16 and Q8_0, then "
                         "llama.cpp's Q4_0, Q4_K_M, Q5_K_M and Q6_K of the F16 one, Falcon3-3B-shaped "
                         "I2_S; 0.7-2.5 GB each) into DIR; alone, only this")
    ap.add_argument("--bench-files", metavar="NAMES", default=",".join(BENCH_FILES),
                    help="which of --bench's files, comma-separated (default: "
                         f"{','.join(BENCH_FILES)})")
    ap.add_argument("--quantizer", metavar="PATH", type=Path,
                    help="llama.cpp's llama-quantize program, instead of the llama_cpp Python "
                         "package's quantizer")
    ap.add_argument("--bench-moe", metavar="DIR", type=Path,
                    help="write a Qwen3-30B-A3B-shaped mixture of experts cut to 4 layers (F16, "
                         "then llama.cpp's Q4_K_M of it; 4.9 and 1.5 GB) and a gpt-oss-20b-shaped "
                         "one cut to 2 (F16, then llama.cpp's MXFP4_MOE; 5.5 and 2.1 GB) into DIR; "
                         "alone, only this")
    ap.add_argument("--bitnet-cpp", type=Path, default=Path("/tmp/hesper-bitnet-cpp"),
                    help="bitnet-cpp/build.sh's work folder (default /tmp/hesper-bitnet-cpp)")
    a = ap.parse_args()
    steps = a.steps or ([] if a.bench or a.bench_moe else ["models", "llama"])
    if set(steps) - {"models", "llama", "bitnet", "validate"}:
        ap.error("steps are models, llama, bitnet and validate")
    if "models" in steps:
        step_models(a.seed, a.threads)
    if "llama" in steps:
        step_llama(a.threads)
    if "bitnet" in steps:
        step_bitnet(a.bitnet_cpp)
    if "validate" in steps:
        step_validate()
    if a.bench:
        files = [n for n in a.bench_files.split(",") if n]
        if set(files) - set(BENCH_FILES):
            ap.error(f"--bench-files are among {','.join(BENCH_FILES)}")
        step_bench(a.bench, a.seed, a.threads, files, a.quantizer)
    if a.bench_moe:
        step_bench_moe(a.bench_moe, a.seed, a.threads, a.quantizer)


if __name__ == "__main__":
    main()
