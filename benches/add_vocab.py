"""Copies a GGUF with the tokenizer of another (a llama.cpp `models/ggml-vocab-*.gguf` file):
the synthetic 2B4T-shaped models (`golden-values/generate.py --bench-2b4t`) have no text
vocabulary, and a server benchmark needs one. Every `tokenizer.*` key of the copy comes from
VOCAB; tensors and other keys are copied byte for byte (tensor offsets are relative to the
data section, so a longer header moves nothing).

Usage: python benches/add_vocab.py IN.gguf VOCAB.gguf OUT.gguf
"""

import shutil
import struct
import sys

# Sizes of GGUF's fixed-size value types (gguf.md: uint8 .. float64 and bool).
FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
STRING, ARRAY = 8, 9


def skip_value(b, at, t):
    if t in FIXED:
        return at + FIXED[t]
    if t == STRING:
        (n,) = struct.unpack_from("<Q", b, at)
        return at + 8 + n
    assert t == ARRAY, f"value type {t}"
    sub, n = struct.unpack_from("<IQ", b, at)
    at += 12
    if sub in FIXED:
        return at + n * FIXED[sub]
    for _ in range(n):
        at = skip_value(b, at, sub)
    return at


def read_kvs(b):
    """(n_tensors, [(key, raw bytes of the pair)], offset after the pairs)."""
    magic, _version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", b, 0)
    assert magic == b"GGUF"
    at, kvs = 24, []
    for _ in range(n_kv):
        start = at
        (n,) = struct.unpack_from("<Q", b, at)
        key = b[at + 8:at + 8 + n].decode()
        (t,) = struct.unpack_from("<I", b, at + 8 + n)
        at = skip_value(b, at + 12 + n, t)
        kvs.append((key, b[start:at]))
    return n_tensors, kvs, at


def skip_tensor_infos(b, at, n):
    for _ in range(n):
        (length,) = struct.unpack_from("<Q", b, at)
        at += 8 + length
        (dims,) = struct.unpack_from("<I", b, at)
        at += 4 + 8 * dims + 4 + 8
    return at


def main():
    src, vocab, out = sys.argv[1:4]
    with open(src, "rb") as f:
        head = f.read(64 << 20)
    n_tensors, kvs, at = read_kvs(head)
    infos_end = skip_tensor_infos(head, at, n_tensors)
    align = 32
    for key, raw in kvs:
        if key == "general.alignment":
            align = struct.unpack_from("<I", raw, len(raw) - 4)[0]
    data_start = (infos_end + align - 1) // align * align
    with open(vocab, "rb") as f:
        _, vocab_kvs, _ = read_kvs(f.read())
    kept = [kv for kv in kvs if not kv[0].startswith("tokenizer.")]
    kept += [kv for kv in vocab_kvs if kv[0].startswith("tokenizer.")]
    header = bytearray(struct.pack("<4sIQQ", b"GGUF", 3, n_tensors, len(kept)))
    for _, raw in kept:
        header += raw
    header += head[at:infos_end]
    header += b"\0" * ((-len(header)) % align)
    with open(src, "rb") as f, open(out, "wb") as o:
        o.write(header)
        f.seek(data_start)
        shutil.copyfileobj(f, o, 64 << 20)


if __name__ == "__main__":
    main()
