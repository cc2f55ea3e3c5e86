#!/usr/bin/env python3
"""Write llama.cpp's detokenization of every token id as golden values for hesper-rs.

Run with a Python that has llama-cpp-python 0.3.36 (its vendored llama.cpp is commit 0c1e57098):

    python make_detok_golden.py

Writes, next to this script:

  detok.json  For each shipped vocabulary (llama.cpp's llama-bpe and llama-spm test vocabularies
              here, and the built-in model ../../models/hesper-kjv.gguf), what
              llama_token_to_piece(vocab, id, buf, n, lstrip = 0, special) returns for every id,
              with special = true and false. 128k pieces are too many to commit as text, so
              they are stored as SHA-256 digests of blocks of BLOCK consecutive ids (each id
              contributes its byte length as u32 LE, then its bytes); a test that finds a
              block differing prints that block's pieces.
"""
import ctypes
import hashlib
import json
import os
import struct
import sys
import tempfile

from llama_cpp import llama_cpp as C

from make_tokenizer_golden import gguf_metadata, gguf_text, write_tensorless_gguf

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = "llama.cpp 0c1e57098 via llama-cpp-python 0.3.36 (PyPI sdist, built from source)"
BLOCK = 256
VOCABS = {
    "llama-bpe": "ggml-vocab-llama-bpe.gguf",
    "llama-spm": "ggml-vocab-llama-spm.gguf",
    "hesper-kjv": "../../models/hesper-kjv.gguf",
}


def vocab_only_copy(src, dst):
    """Copies a GGUF v3 file's metadata without its tensors. llama.cpp refuses the built-in
    model (I2_S tensors, arch `bitnet-b1.58`) even vocab-only, so the official arch's keys
    are renamed to mainline's `bitnet` ones; the tokenizer keys are copied unchanged."""
    _, kvs = gguf_metadata(src)
    renamed = [(key.replace("bitnet-b1.58.", "bitnet.", 1),
                struct.pack("<I", 8) + gguf_text("bitnet") if key == "general.architecture"
                else value) for key, value in kvs]
    write_tensorless_gguf(dst, renamed)


def load(path):
    params = C.llama_model_default_params()
    params.vocab_only = True
    model = C.llama_model_load_from_file(path.encode(), params)
    if not model:
        sys.exit(f"llama.cpp could not load {path}")
    return model


def piece(vocab, token, special):
    cap = 256
    while True:
        buf = ctypes.create_string_buffer(cap)
        n = C.llama_token_to_piece(vocab, token, buf, cap, 0, special)
        if n >= 0:
            return buf.raw[:n]
        cap = -n


def vocab_entry(name, rel):
    path = os.path.normpath(os.path.join(HERE, rel))
    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, "vocab.gguf")
        vocab_only_copy(path, copy)
        model = load(copy)
    vocab = C.llama_model_get_vocab(model)
    n = C.llama_vocab_n_tokens(vocab)
    entry = {"file": rel, "n_tokens": n, "block": BLOCK}
    for special in (True, False):
        digests = []
        for start in range(0, n, BLOCK):
            h = hashlib.sha256()
            for t in range(start, min(n, start + BLOCK)):
                p = piece(vocab, t, special)
                h.update(struct.pack("<I", len(p)) + p)
            digests.append(h.hexdigest())
        entry["special" if special else "plain"] = digests
    C.llama_model_free(model)
    print(f"{name}: {n} tokens, {len(entry['plain'])} blocks")
    return entry


def main():
    C.llama_backend_init()
    vocabs = {name: vocab_entry(name, rel) for name, rel in VOCABS.items()}
    detok = {"source": SOURCE + ": llama_token_to_piece(vocab, id, buf, n, lstrip 0, special) "
                                "on a vocab_only model",
             "note": "per vocabulary: SHA-256 of each block of `block` ids, each id as u32 LE "
                     "byte length + bytes; `special` with special = true, `plain` with false",
             "vocabs": vocabs}
    with open(os.path.join(HERE, "detok.json"), "w") as f:
        json.dump(detok, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
