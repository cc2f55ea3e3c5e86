"""Writes models/hesper-tiny.gguf, the demo model built into hesper-rs.

A BitNet b1.58 model in the official layout (arch `bitnet-b1.58`, I2_S ternary projections
with an f32 scale per tensor, ReLU² FFN, tied LM head) with RANDOM weights: it exercises the
whole pipeline (GGUF -> tokenizer -> forward -> sampler) on a fresh clone without any download,
but its text is gibberish. Its vocabulary is llama.cpp's SentencePiece test vocabulary
(golden-values/tokenizer/ggml-vocab-llama-spm.gguf, 32000 tokens). The embedding is Q8_0 to keep
the file small (~4.5 MB).

    python models/make_tiny_model.py [--vocab PATH] [--out PATH]
Needs numpy and gguf (PyPI).
"""
import argparse
import pathlib
import struct

import numpy as np
from gguf import GGUFReader, GGUFValueType as VT, GGMLQuantizationType as QT
from gguf.quants import quantize

from gguf_bitnet import ARCH, I2_S, gguf_str, i2s, kv, scalar, write

ROOT = pathlib.Path(__file__).resolve().parent.parent
N_EMBD, N_FF, N_HEAD, N_HEAD_KV, N_LAYER, N_CTX = 128, 384, 2, 1, 2, 512


def copy_tokenizer(reader):
    """Re-encodes every tokenizer.* key of the vocabulary file."""
    out = []
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        t = field.types[0]
        if t == VT.STRING:
            out.append(kv(name, VT.STRING, gguf_str(bytes(field.parts[-1]).decode())))
        elif t == VT.ARRAY:
            et = field.types[1]
            items = [field.parts[i] for i in field.data]
            if et == VT.STRING:
                body = b"".join(gguf_str(bytes(p).decode()) for p in items)
            else:
                body = b"".join(np.asarray(p).tobytes() for p in items)
            out.append(kv(name, VT.ARRAY, struct.pack("<IQ", et, len(items)) + body))
        else:
            out.append(kv(name, t, np.asarray(field.parts[-1]).tobytes()))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", default=str(ROOT / "golden-values/tokenizer/ggml-vocab-llama-spm.gguf"))
    ap.add_argument("--out", default=str(ROOT / "models/hesper-tiny.gguf"))
    ap.add_argument("--seed", type=int, default=2026)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    reader = GGUFReader(a.vocab)
    n_vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    hd = N_EMBD // N_HEAD
    u32 = lambda k, v: kv(f"{ARCH}.{k}", VT.UINT32, scalar(VT.UINT32, v))
    kvs = [
        kv("general.architecture", VT.STRING, gguf_str(ARCH)),
        kv("general.name", VT.STRING, gguf_str("hesper-tiny (random weights, demo only)")),
        u32("vocab_size", n_vocab), u32("context_length", N_CTX), u32("embedding_length", N_EMBD),
        u32("block_count", N_LAYER), u32("feed_forward_length", N_FF), u32("rope.dimension_count", hd),
        u32("attention.head_count", N_HEAD), u32("attention.head_count_kv", N_HEAD_KV),
        kv(f"{ARCH}.attention.layer_norm_rms_epsilon", VT.FLOAT32, scalar(VT.FLOAT32, 1e-5)),
        kv(f"{ARCH}.rope.freq_base", VT.FLOAT32, scalar(VT.FLOAT32, 500000.0)),
    ] + copy_tokenizer(reader)

    tensors = []  # (name, ne, type id, bytes)
    emb = (0.5 * rng.standard_normal((n_vocab, N_EMBD))).astype(np.float32)
    tensors.append(("token_embd.weight", [N_EMBD, n_vocab], int(QT.Q8_0), quantize(emb, QT.Q8_0).tobytes()))
    gain = lambda n: (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32).tobytes()
    tensors.append(("output_norm.weight", [N_EMBD], 0, gain(N_EMBD)))
    shapes = {"attn_q": (N_EMBD, N_EMBD), "attn_k": (N_HEAD_KV * hd, N_EMBD), "attn_v": (N_HEAD_KV * hd, N_EMBD),
              "attn_output": (N_EMBD, N_EMBD), "ffn_gate": (N_FF, N_EMBD), "ffn_up": (N_FF, N_EMBD), "ffn_down": (N_EMBD, N_FF)}
    for il in range(N_LAYER):
        for norm, n in (("attn_norm", N_EMBD), ("attn_sub_norm", N_EMBD), ("ffn_norm", N_EMBD), ("ffn_sub_norm", N_FF)):
            tensors.append((f"blk.{il}.{norm}.weight", [n], 0, gain(n)))
        for name, (rows, cols) in shapes.items():
            t = rng.integers(-1, 2, size=(rows, cols))
            tensors.append((f"blk.{il}.{name}.weight", [cols, rows], I2_S, i2s(t, 1.0 / np.sqrt(cols))))

    write(a.out, kvs, tensors)
    print("wrote", a.out, pathlib.Path(a.out).stat().st_size, "bytes")


if __name__ == "__main__":
    main()
