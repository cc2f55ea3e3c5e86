#!/usr/bin/env python3
"""Golden values for the model families beside BitNet: tiny synthetic `llama` and `qwen2` GGUF
files and llama.cpp's logits and residual streams for them.

Steps (positional; default both):

  models   Write the tiny models to models/:
             tiny-llama-f16     arch llama, F16 projections, tied F16 embedding, rope_freqs
                                (Llama 3.1's per-pair frequency divisors), GQA 4/2
             tiny-llama-q8_0    the same values quantized to Q8_0 (gguf-py's quantizer), with an
                                untied Q8_0 output.weight
             tiny-qwen2-f16     arch qwen2: F16 projections with F32 Q/K/V biases, NeoX RoPE
             tiny-falcon3-f16   arch llama in Falcon3's head geometry: head width 256 named by
                                attention.key_length (Q 512 wide over n_embd 256), GQA 2/1,
                                theta 1000042, untied F16 output.weight; ternary values t*beta
                                stored as F16 (what a 1.58-bit Falcon3 file holds as I2_S codes)
  llama    Run llama.cpp (generate.py's LlamaCpp: CPU, flash attention off, F32 KV cache, one
           ubatch) on each model and the three token sequences of generate.py; write
           out/<stem>.json with logits and every layer's l_out, in generate.py's format.

Every tensor draws from its own stream (generate.py's tensor_rng, seed 20261122), so the files
are reproduced byte for byte. Requirements as generate.py (numpy, gguf==0.19.0; the llama step
needs llama-cpp-python 0.3.36, or its package pointed at a libllama build of llama.cpp
0c1e57098 through a lib/ folder).
"""
from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from generate import (GGML_F16, GGML_F32, KV, MODELS_DIR, SEED, TINY, GGUFStreamWriter, HParams,
                      LlamaCpp, TensorInfo, gen_norm, kv_str, kv_u32, kv_f32, tensor_rng,
                      token_sequences, write_outputs)

GGML_Q8_0 = 8
LLAMA_FTYPE = {GGML_F16: 1, GGML_Q8_0: 7}


@dataclass(frozen=True)
class Family:
    """One tiny model: its architecture, shape and storage."""
    stem: str
    arch: str
    hp: HParams
    head_dim: int               # attention.key_length when it differs from n_embd / n_head
    weight_type: int            # GGML_F16 or GGML_Q8_0
    untied: bool                # an output.weight of weight_type
    biases: bool                # Q/K/V biases (qwen2)
    rope_freqs: bool            # a rope_freqs.weight tensor (Llama 3.1)
    ternary: bool               # projections hold t*beta (Falcon3's 1.58-bit values)

    @property
    def path(self) -> Path:
        return MODELS_DIR / f"{self.stem}.gguf"

    # write_outputs() reads these from a generate.py Variant
    activation = "silu"

    @property
    def act_quant(self) -> str:
        return {GGML_F16: "f16", GGML_Q8_0: "q8_0"}[self.weight_type]

    def projections(self) -> list[tuple[str, int, int]]:
        """(name, rows, cols) of a layer's projections."""
        E, F = self.hp.n_embd, self.hp.n_ff
        Q, KV_ = self.hp.n_head * self.head_dim, self.hp.n_head_kv * self.head_dim
        return [("attn_q", Q, E), ("attn_k", KV_, E), ("attn_v", KV_, E), ("attn_output", E, Q),
                ("ffn_gate", F, E), ("ffn_up", F, E), ("ffn_down", E, F)]


FALCON3 = HParams(n_vocab=512, n_embd=256, n_ff=512, n_head=2, n_head_kv=1, n_layer=2, n_ctx=256,
                  rope_base=1000042.0)
FAMILIES = [
    Family("tiny-llama-f16", "llama", TINY, 64, GGML_F16, False, False, True, False),
    Family("tiny-llama-q8_0", "llama", TINY, 64, GGML_Q8_0, True, False, True, False),
    Family("tiny-qwen2-f16", "qwen2", TINY, 64, GGML_F16, False, True, False, False),
    Family("tiny-falcon3-f16", "llama", FALCON3, 256, GGML_F16, True, False, False, True),
]


def projection(seed: int, f: Family, name: str, rows: int, cols: int,
               dense: bool = False) -> np.ndarray:
    """A projection's values (f16-exact), scaled so that unit-RMS inputs give outputs of std ~1.
    Ternary families (unless `dense`): t*beta16 with t uniform in {-1, 0, 1}."""
    rng = tensor_rng(seed, name)
    if f.ternary and not dense:
        t = rng.integers(-1, 2, size=(rows, cols)).astype(np.float32)
        beta = np.float16(rng.uniform(1.0, 2.0) * np.sqrt(1.5 / cols))
        return (t * np.float32(beta)).astype(np.float16)
    return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float16)


def rope_freqs(hp: HParams, head_dim: int) -> np.ndarray:
    """Llama 3.1's divisors shape: 1 for high frequencies, up to 8 for low ones."""
    half = head_dim // 2
    return np.where(np.arange(half) < half // 4, 1.0, np.linspace(1.0, 8.0, half)).astype(np.float32)


def encode(f: Family, w: np.ndarray) -> bytes:
    if f.weight_type == GGML_F16:
        return w.astype(np.float16).tobytes()
    from gguf import GGMLQuantizationType, quants
    return quants.quantize(w.astype(np.float32), GGMLQuantizationType.Q8_0).tobytes()


def nbytes(ggml_type: int, ne: tuple[int, ...]) -> int:
    n = int(np.prod(ne))
    return {GGML_F32: 4 * n, GGML_F16: 2 * n, GGML_Q8_0: n // 32 * 34}[ggml_type]


class Info(TensorInfo):
    """A tensor of any type this script writes (generate.py's covers the BitNet types)."""

    @property
    def nbytes(self) -> int:
        return nbytes(self.ggml_type, self.ne)


def tensors(f: Family, seed: int) -> list[tuple[Info, bytes]]:
    hp, E = f.hp, f.hp.n_embd
    emb = (hp.emb_std * tensor_rng(seed, "token_embd.0").standard_normal((hp.n_vocab, E)))
    out = [(Info("token_embd.weight", (E, hp.n_vocab), GGML_F16), emb.astype(np.float16).tobytes()),
           (Info("output_norm.weight", (E,), GGML_F32),
            gen_norm(seed, "output_norm.weight", E).tobytes())]
    if f.untied:
        w = projection(seed, f, "output.weight", hp.n_vocab, E, dense=True) * np.float16(4.0)
        out.append((Info("output.weight", (E, hp.n_vocab), f.weight_type), encode(f, w)))
    if f.rope_freqs:
        out.append((Info("rope_freqs.weight", (f.head_dim // 2,), GGML_F32),
                    rope_freqs(hp, f.head_dim).tobytes()))
    for il in range(hp.n_layer):
        p = f"blk.{il}."
        out.append((Info(p + "attn_norm.weight", (E,), GGML_F32),
                    gen_norm(seed, p + "attn_norm.weight", E).tobytes()))
        for name, rows, cols in f.projections():
            w = projection(seed, f, p + name + ".weight", rows, cols)
            out.append((Info(p + name + ".weight", (cols, rows), f.weight_type), encode(f, w)))
            if f.biases and name in ("attn_q", "attn_k", "attn_v"):
                b = 0.5 * tensor_rng(seed, p + name + ".bias").standard_normal(rows)
                out.append((Info(p + name + ".bias", (rows,), GGML_F32),
                            b.astype(np.float32).tobytes()))
            if name == "attn_output":
                out.append((Info(p + "ffn_norm.weight", (E,), GGML_F32),
                            gen_norm(seed, p + "ffn_norm.weight", E).tobytes()))
    return out


def kvs(f: Family) -> list[KV]:
    A, hp = f.arch, f.hp
    keys = [kv_str("general.architecture", A), kv_str("general.name", f"hesper-rs {f.stem}"),
            kv_u32(f"{A}.vocab_size", hp.n_vocab), kv_u32(f"{A}.context_length", hp.n_ctx),
            kv_u32(f"{A}.embedding_length", hp.n_embd), kv_u32(f"{A}.block_count", hp.n_layer),
            kv_u32(f"{A}.feed_forward_length", hp.n_ff),
            kv_u32(f"{A}.attention.head_count", hp.n_head),
            kv_u32(f"{A}.attention.head_count_kv", hp.n_head_kv),
            kv_f32(f"{A}.attention.layer_norm_rms_epsilon", hp.eps),
            kv_f32(f"{A}.rope.freq_base", hp.rope_base),
            kv_u32(f"{A}.rope.dimension_count", f.head_dim)]
    if f.head_dim != hp.n_embd // hp.n_head:
        keys += [kv_u32(f"{A}.attention.key_length", f.head_dim),
                 kv_u32(f"{A}.attention.value_length", f.head_dim)]
    return keys + [kv_u32("general.file_type", LLAMA_FTYPE[f.weight_type]),
                   kv_u32("general.quantization_version", 2),
                   kv_str("tokenizer.ggml.model", "none")]


def step_models(seed: int) -> None:
    for f in FAMILIES:
        ts = tensors(f, seed)
        w = GGUFStreamWriter(f.path, kvs(f), [info for info, _ in ts])
        for info, data in ts:
            assert len(data) == info.nbytes, info.name
            w.write(info.name, data)
        w.close()
        print(f"wrote {f.path.relative_to(MODELS_DIR.parent)}  {f.path.stat().st_size:,d} B")


def step_llama(threads: int) -> None:
    llama = LlamaCpp(threads)
    for f in FAMILIES:
        t0 = time.time()
        # llama.cpp sizes the context from hp.n_ctx and checks n_vocab; the residual stream is
        # n_embd wide whatever the head width
        results = [(toks, *llama.run(f.path, f.hp, toks)[:2]) for toks in token_sequences(f.hp)]
        write_outputs(f, f.hp, llama.description(), results)
        print(f"  {f.stem}: llama.cpp {time.time() - t0:.1f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("steps", nargs="*", metavar="STEP", help="models, llama (default: both)")
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--threads", type=int, default=2, help="llama.cpp threads (default 2)")
    a = ap.parse_args()
    steps = a.steps or ["models", "llama"]
    if set(steps) - {"models", "llama"}:
        ap.error("steps are models and llama")
    if "models" in steps:
        step_models(a.seed)
    if "llama" in steps:
        step_llama(a.threads)


if __name__ == "__main__":
    main()
