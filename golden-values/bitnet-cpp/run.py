#!/usr/bin/env python3
"""The I2_S golden model through bitnet.cpp, an implementation written elsewhere.

    bash build.sh /tmp/hesper-bitnet-cpp              # once, ~10 min on 2 cores
    python run.py /tmp/hesper-bitnet-cpp              # seconds; needs numpy (generate.py's)

Runs dump-relu2 (bitnet.cpp with its `bitnet` graph's FFN activation switched to ReLU², as
the model is trained) on models/tiny-i2s-bitnet.gguf and dump-silu (bitnet.cpp as published)
on the same file, and writes for each, in the golden format of generate.py (read by the Rust
tests):

  out/tiny-i2s.bitnet-cpp-relu2.json     logits + hidden (l_out) of the three sequences,
  out/tiny-i2s.bitnet-cpp-relu2.ops.*    every op of every layer for s1;
  out/tiny-i2s.bitnet-cpp-silu.{json,ops.*}   the same, SiLU.

models/tiny-i2s-bitnet.gguf is tiny-i2s (the same I2_S bytes, f32 β, F16 tied embedding) under
the arch name that this bitnet.cpp knows (`bitnet`; `bitnet-b1.58` came later), written by
generate.py's own writer. bitnet.cpp's graph for `bitnet` computes SiLU; hesper-rs reads the
key `bitnet.hidden_activation`, which this file sets to "relu2", and the SiLU manifest names
models/tiny-i2s-bitnet-silu.gguf, the same file with "silu" there (bitnet.cpp ignores the key).

Finally it prints how far the outputs are from our float64 reference (out/tiny-i2s.*), op by op,
into out/bitnet-cpp-validation.txt.
"""
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import generate as G  # noqa: E402

SOURCE = ("bitnet.cpp: microsoft/BitNet 4645960 with its llama.cpp fork Eddie-Wang1120/llama.cpp "
          "406a5036 (x86 I2_S x I8_S kernels), CPU, flash attention off, KV cache F32 (a guard "
          "relaxed to admit F32 V), "
          "n_threads 2, one ubatch, logits for all positions; hidden = l_out-<il>")
# graph names of bitnet.cpp's `bitnet` graph for each op of generate.OP_NAMES, with the ggml ops
# that carry it (a name can label several tensors: Qcur is the projection and its RoPE output)
GRAPH = {"attn_norm": ("attn_norm", ("MUL",)), "q_proj": ("Qcur", ("MUL_MAT",)),
         "k_proj": ("Kcur", ("MUL_MAT",)), "v_proj": ("Vcur", ("MUL_MAT",)),
         "q_rope": ("Qcur", ("ROPE",)), "k_rope": ("Kcur", ("ROPE",)),
         "kqv_out": ("kqv_out", ("CONT",)), "attn_sub_norm": ("attn_sub_norm", ("MUL",)),
         "attn_out": ("attn_o_out", ("MUL_MAT",)), "ffn_inp": ("ffn_inp", ("ADD",)),
         "ffn_norm": ("ffn_norm", ("MUL",)), "ffn_gate": ("ffn_gate", ("MUL_MAT",)),
         "ffn_up": ("ffn_up", ("MUL_MAT",)), "ffn_act": ("ffn_sub_out", ("MUL",)),
         "ffn_sub_norm": ("ffn_sub_norm", ("MUL",)), "ffn_down": ("ffn_down", ("MUL_MAT",)),
         "l_out": ("l_out", ("ADD",))}


def write_models() -> dict[str, Path]:
    """tiny-i2s under the `bitnet` arch, with hidden_activation relu2 and silu."""
    m = G.make_synthetic(G.TINY, G.SEED)
    paths = {}
    for act, stem in (("relu2", "tiny-i2s-bitnet"), ("silu", "tiny-i2s-bitnet-silu")):
        v = G.Variant(stem, "bitnet", G.GGML_I2_S, False, G.GGML_F16, act, "per_token_i8")
        # this llama.cpp fork spells the id-only vocabulary "no_vocab" (later ones: "none")
        kvs = [G.kv_str("tokenizer.ggml.model", "no_vocab") if kv.key == "tokenizer.ggml.model"
               else kv for kv in G.mainline_kvs(G.TINY, f"hesper-rs {stem}", 40)]
        kvs.append(G.kv_str("bitnet.hidden_activation", act))
        w = G.GGUFStreamWriter(v.path, kvs, G.variant_tensor_infos(v, G.TINY))
        w.write("token_embd.weight", m.token_embd.astype(np.float16))
        w.write("output_norm.weight", m.output_norm)
        for il in range(G.TINY.n_layer):
            for name, role in G.layer_tensor_order(il, False):
                w.write(name, m.norms[il][role] if role in G.NORMS
                        else G.encode_projection(v, m.proj[il][role]))
        w.close()
        paths[act] = v.path
        print(f"wrote {v.path.relative_to(G.ROOT)} {v.path.stat().st_size:,d} B")
    return paths


def dump(exe: Path, model: Path, tokens: list[int]) -> tuple[np.ndarray, dict]:
    """Logits [n, n_vocab] and {(name, op): [values, ...]} from one bitnet.cpp run."""
    names = sorted({nm for nm, _ in GRAPH.values()} | {"result_norm"})
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([str(exe), str(model), tmp, ",".join(map(str, tokens)), ",".join(names)],
                       check=True, capture_output=True)
        n = len(tokens)
        logits = np.fromfile(Path(tmp) / "logits.f32", "<f4").reshape(n, -1)
        tensors: dict = {}
        for line in (Path(tmp) / "index.tsv").read_text().splitlines():
            f, name, op, *ne = line.split("\t")
            a = np.fromfile(Path(tmp) / f, "<f4")
            tensors.setdefault((name, op), []).append(a.reshape(n, -1) if a.size % n == 0 else a)
    return logits, tensors


def one(tensors: dict, name: str, ops: tuple[str, ...]) -> np.ndarray:
    hits = [a for op in ops for a in tensors.get((name, op), [])]
    assert len(hits) == 1, f"{name} {ops}: {len(hits)} tensors"
    return hits[0]


def run_variant(exe: Path, model: Path, act: str, stem: str) -> dict[str, np.ndarray]:
    hp, seqs, ops = G.TINY, [], None
    model_rel = f"models/{model.name}"
    for i, tokens in enumerate(G.token_sequences(hp)):
        logits, t = dump(exe, model, tokens)
        hidden = np.stack([one(t, f"l_out-{il}", ("ADD",)) for il in range(hp.n_layer)])
        lf, hf = f"{stem}.s{i}.logits.f32", f"{stem}.s{i}.hidden.f32"
        np.ascontiguousarray(logits, "<f4").tofile(G.OUT_DIR / lf)
        np.ascontiguousarray(hidden, "<f4").tofile(G.OUT_DIR / hf)
        seqs.append({"tokens": tokens, "logits": lf, "hidden": hf})
        if i == G.OPS_SEQUENCE:
            ops = {f"{op}-{il}": one(t, f"{nm}-{il}", kinds)
                   for il in range(hp.n_layer) for op, (nm, kinds) in GRAPH.items()}
            ops["result_norm"] = one(t, "result_norm", ("MUL",))
            ops = {k: ops[k] for k in G.op_keys(hp)}
    label = SOURCE + ("" if act == "silu" else "; its `bitnet` graph's FFN switched from SiLU to "
                      "ReLU² (one token, build.sh)")
    manifest = {"model": model_rel, "reference": label, "activation": act,
                "act_quant": "per_token_i8", "n_vocab": hp.n_vocab, "n_embd": hp.n_embd,
                "n_layer": hp.n_layer, "sequences": seqs}
    (G.OUT_DIR / f"{stem}.json").write_text(G.format_manifest(manifest))
    v = G.Variant(stem, "bitnet", G.GGML_I2_S, False, G.GGML_F16, act, "per_token_i8")
    G.write_ops(v, hp, label, G.token_sequences(hp)[G.OPS_SEQUENCE], ops)
    ops_json = G.OUT_DIR / f"{stem}.ops.json"          # write_ops names models/<stem>.gguf
    ops_json.write_text(ops_json.read_text().replace(json.dumps(f"models/{stem}.gguf"),
                                                     json.dumps(model_rel), 1))
    print(f"wrote out/{stem}.json + .ops.*")
    return ops


def validation_report(models: dict[str, Path], ops: dict[str, dict[str, np.ndarray]]) -> list[str]:
    """bitnet.cpp against our float64 reference (per-token int8, f32 β, no f16 anywhere) in the
    same activation: logits and hidden per sequence, then every op of s1 (the reference fed its
    own float64 chain, so differences accumulate as in an end-to-end run)."""
    lines = ["bitnet.cpp (4645960 / 406a5036) vs the float64 NumPy reference of generate.py, "
             "same model, same activation", ""]
    ref_ops = {}
    for act in ("relu2", "silu"):
        m = G.load_ref_model(models[act])
        _, seqs = G.read_outputs(f"tiny-i2s.bitnet-cpp-{act}")
        for i, (tokens, (logits, hidden)) in enumerate(zip(G.token_sequences(G.TINY), seqs)):
            rec = {} if i == G.OPS_SEQUENCE else None
            rl, rh = G.reference_forward(m, tokens, act, "per_token_i8", ops=rec)
            a = G.agreement(logits, rl)
            lines.append(f"{act:5s} s{i} n={len(tokens):2d}: max|dlogits| {G.max_abs(logits, rl):.3e} "
                         f"(max|logit| {np.abs(rl).max():.2f}), max|dhidden| "
                         f"{G.max_abs(hidden, rh):.3e}, min cosine {a['min_cosine']:.7f}, "
                         f"argmax {a['same_argmax']}/{a['positions']}")
            if rec is not None:
                ref_ops[act] = rec
    lines += ["", f"{'op (s1)':16s} {'relu2':>10s} {'silu':>10s} {'max|val|':>9s}"]
    for key in G.op_keys(G.TINY):
        d = [G.max_abs(ops[act][key], ref_ops[act][key]) for act in ("relu2", "silu")]
        vmax = max(float(np.abs(ref_ops[act][key]).max()) for act in ("relu2", "silu"))
        lines.append(f"{key:16s} {d[0]:10.2e} {d[1]:10.2e} {vmax:9.2f}")
    return lines


def main() -> None:
    work = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/hesper-bitnet-cpp")
    models = write_models()
    ops = {act: run_variant(work / f"dump-{act}", models[act], act, f"tiny-i2s.bitnet-cpp-{act}")
           for act in ("relu2", "silu")}
    report = validation_report(models, ops)
    (G.OUT_DIR / "bitnet-cpp-validation.txt").write_text("\n".join(report) + "\n")
    print("\n".join(report))


if __name__ == "__main__":
    main()
