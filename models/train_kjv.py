"""Trains hesper-kjv, the default model built into hesper-rs: a tiny BitNet b1.58 model on the King
James Bible, with a SentencePiece tokenizer trained on the same text, exported to the official I2_S
layout (arch `bitnet-b1.58`, the 2B4T file's layout).

    apt-get install bible-kjv          # the text (Debian's bible-kjv-text, printed by `bible`)
    pip install -r models/requirements-train.txt
    python models/train_kjv.py         # all stages; config in models/kjv.json

Stages (`--stage`, default all, in order; each reads what the previous one left in --work):
  corpus     the text from `bible`, one chapter per paragraph; every 20th chapter held out
  tokenizer  SentencePiece BPE on the training verses (byte fallback, no normalization, so
             llama.cpp's SPM tokenizer gives the same ids as the trainer's encoder)
  train      the BitNet b1.58 recipe: absmean ternary weights and per-token absmax int8 activations,
             both with a straight-through estimator, ReLU² FFN, attention and FFN sub-norms,
             NeoX RoPE, GQA, tied embedding; AdamW, warmup then cosine decay
  export     models/hesper-kjv.gguf (I2_S projections with their absmean scale, F16 tied embedding),
             models/kjv-valid.txt (the held-out text) and models/kjv-loss.{csv,png}
  reference  models/kjv-reference.json: the trainer's token ids for held-out chapters and its
             logits for a prompt (tests/tests/trained_model.rs checks the engine against them)

The model the engine runs is exactly the one trained: BitLinear's forward here is the engine's
y = beta * sum(t * q) / s with the same absmax int8 rounding (round half to even).
"""
import argparse
import csv
import json
import math
import pathlib
import re
import subprocess
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
HELD_OUT_EVERY = 20  # chapter i (0-based, Bible order) is validation text when i % 20 == 19


def load_config(path):
    with open(path) as f:
        return json.load(f)


# ---------------------------------------------------------------------------------------------
# corpus


def stage_corpus(cfg, work):
    raw = subprocess.run(["bible", "-f", "Gen1:1-Rev22:21"], capture_output=True, text=True, check=True).stdout
    chapters, key = [], None
    for line in raw.splitlines():
        m = re.match(r"^(\w+?)(\d+):(\d+) (.*)$", line.strip())
        if not m:
            continue
        book, chap, verse = m.group(1), m.group(2), m.group(4).strip()
        if (book, chap) != key:
            chapters.append([])
            key = (book, chap)
        chapters[-1].append(verse)
    train = [c for i, c in enumerate(chapters) if i % HELD_OUT_EVERY != HELD_OUT_EVERY - 1]
    valid = [c for i, c in enumerate(chapters) if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1]
    (work / "chapters-train.json").write_text(json.dumps(train))
    (work / "chapters-valid.json").write_text(json.dumps(valid))
    (work / "verses-train.txt").write_text("\n".join(v for c in train for v in c) + "\n")
    print(f"corpus: {len(chapters)} chapters, {len(train)} train / {len(valid)} held out, "
          f"{sum(len(' '.join(c)) for c in train)} / {sum(len(' '.join(c)) for c in valid)} bytes")


# ---------------------------------------------------------------------------------------------
# tokenizer


def stage_tokenizer(cfg, work):
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(
        input=str(work / "verses-train.txt"), model_prefix=str(work / "kjv-sp"),
        vocab_size=cfg["vocab_size"], model_type="bpe", byte_fallback=True, character_coverage=1.0,
        normalization_rule_name="identity", remove_extra_whitespaces=False, split_digits=True,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, num_threads=2, minloglevel=2,
    )
    print("tokenizer:", work / "kjv-sp.model")


def processor(work):
    import sentencepiece as spm

    return spm.SentencePieceProcessor(model_file=str(work / "kjv-sp.model"))


def token_stream(sp, chapters):
    """BOS + the chapter's verses joined by spaces, for every chapter; also where each verse starts.

    Pieces never cross a space, so a chapter's ids are its verses' ids concatenated (each verse
    starting with its own '▁' prefix), which is also what llama.cpp gives for the chapter text.
    """
    ids, starts = [], []
    for chapter in chapters:
        ids.append(sp.bos_id())
        for verse in chapter:
            starts.append(len(ids))
            ids.extend(sp.encode(verse))
    return np.asarray(ids, dtype=np.int64), np.asarray(starts, dtype=np.int64)


# ---------------------------------------------------------------------------------------------
# model


def build_model(cfg):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    d, n_head, n_kv, n_ff = cfg["n_embd"], cfg["n_head"], cfg["n_head_kv"], cfg["n_ff"]
    hd, eps = d // n_head, cfg["rms_eps"]

    def ste(x, xq):
        return x + (xq - x).detach()

    class BitLinear(nn.Linear):
        """W1.58 A8: absmean ternary weights, per-token absmax int8 activations (STE for both)."""

        def __init__(self, n_in, n_out):
            super().__init__(n_in, n_out, bias=False)
            nn.init.normal_(self.weight, std=0.02)

        def forward(self, x):
            w = self.weight
            beta = w.abs().mean().clamp(min=1e-5)
            w = ste(w, (w / beta).round().clamp(-1, 1) * beta)
            s = 127.0 / x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-5)
            x = ste(x, (x * s).round().clamp(-128, 127) / s)
            return F.linear(x, w)

    class RMSNorm(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(n))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * self.weight

    def rope(x, cos, sin):  # NeoX: (x[i], x[i + hd/2]) rotate together
        a, b = x[..., : hd // 2], x[..., hd // 2:]
        return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn_norm, self.attn_sub_norm = RMSNorm(d), RMSNorm(d)
            self.ffn_norm, self.ffn_sub_norm = RMSNorm(d), RMSNorm(n_ff)
            self.attn_q, self.attn_k = BitLinear(d, d), BitLinear(d, n_kv * hd)
            self.attn_v, self.attn_output = BitLinear(d, n_kv * hd), BitLinear(d, d)
            self.ffn_gate, self.ffn_up, self.ffn_down = BitLinear(d, n_ff), BitLinear(d, n_ff), BitLinear(n_ff, d)

        def forward(self, x, cos, sin):
            B, T, _ = x.shape
            h = self.attn_norm(x)
            q = self.attn_q(h).view(B, T, n_head, hd).transpose(1, 2)
            k = self.attn_k(h).view(B, T, n_kv, hd).transpose(1, 2)
            v = self.attn_v(h).view(B, T, n_kv, hd).transpose(1, 2)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            o = self.attn_sub_norm(o.transpose(1, 2).reshape(B, T, d))
            x = x + self.attn_output(o)
            h = self.ffn_norm(x)
            a = F.relu(self.ffn_gate(h)).square() * self.ffn_up(h)
            return x + self.ffn_down(self.ffn_sub_norm(a))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.token_embd = nn.Embedding(cfg["vocab_size"], d)
            nn.init.normal_(self.token_embd.weight, std=cfg["embd_init_std"])
            self.blocks = nn.ModuleList(Block() for _ in range(cfg["n_layer"]))
            self.output_norm = RMSNorm(d)
            inv = cfg["rope_theta"] ** (-torch.arange(0, hd // 2, dtype=torch.float64) * 2 / hd)
            ang = torch.arange(cfg["n_ctx"], dtype=torch.float64)[:, None] * inv[None, :]
            self.register_buffer("cos", ang.cos().float(), persistent=False)
            self.register_buffer("sin", ang.sin().float(), persistent=False)

        def forward(self, ids):
            T = ids.shape[1]
            x = self.token_embd(ids)
            cos, sin = self.cos[:T], self.sin[:T]
            for blk in self.blocks:
                x = blk(x, cos, sin)
            return self.output_norm(x) @ self.token_embd.weight.T  # tied LM head

    return Model()


# ---------------------------------------------------------------------------------------------
# training


def batches(stream, starts, rng, batch, seq, bos):
    """Windows that start at a verse, with BOS in front (as the engine's prompts have)."""
    ok = starts[starts + seq <= len(stream)]
    pick = rng.choice(ok, size=batch)
    x = np.stack([np.concatenate([[bos], stream[p: p + seq]]) for p in pick])
    return x[:, :-1], x[:, 1:]


def valid_windows(stream, seq):
    """The held-out stream cut into consecutive seq+1 windows (BOS in front of each)."""
    n = (len(stream) - 1) // seq
    return [np.concatenate([[stream[0]], stream[1 + i * seq: 1 + (i + 1) * seq]]) for i in range(n)]


def stage_train(cfg, work):
    import torch
    import torch.nn.functional as F

    torch.manual_seed(cfg["seed"])
    torch.set_num_threads(cfg["threads"])
    sp = processor(work)
    train_ids, train_starts = token_stream(sp, json.loads((work / "chapters-train.json").read_text()))
    valid_ids, _ = token_stream(sp, json.loads((work / "chapters-valid.json").read_text()))
    print(f"tokens: {len(train_ids)} train / {len(valid_ids)} held out")
    seq, batch, steps = cfg["n_ctx"], cfg["batch"], cfg["steps"]
    vw = torch.tensor(np.stack(valid_windows(valid_ids, seq)))
    model = build_model(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"parameters: {n_params} ({n_params - cfg['vocab_size'] * cfg['n_embd']} outside the embedding)")
    decay = [p for n, p in model.named_parameters() if p.dim() == 2]
    rest = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg["weight_decay"]},
                             {"params": rest, "weight_decay": 0.0}], lr=cfg["lr"], betas=(0.9, 0.95))

    def lr_at(step):
        if step < cfg["warmup"]:
            return cfg["lr"] * (step + 1) / cfg["warmup"]
        t = (step - cfg["warmup"]) / max(1, steps - cfg["warmup"])
        return cfg["lr"] * (cfg["lr_final_frac"] + (1 - cfg["lr_final_frac"]) * 0.5 * (1 + math.cos(math.pi * t)))

    def valid_loss():
        model.eval()
        with torch.no_grad():
            losses = [F.cross_entropy(model(w[:, :-1]).reshape(-1, cfg["vocab_size"]), w[:, 1:].reshape(-1),
                                      reduction="sum") for w in vw.split(batch)]
        model.train()
        return float(sum(losses)) / (len(vw) * seq)

    step_fn = torch.compile(model) if cfg["compile"] else model  # eval stays eager (other shapes)
    rng = np.random.default_rng(cfg["seed"])
    log = [("step", "tokens", "seconds", "lr", "train_loss", "valid_loss")]
    t0, running = time.time(), []
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        x, y = batches(train_ids, train_starts, rng, batch, seq, sp.bos_id())
        logits = step_fn(torch.from_numpy(x))
        loss = F.cross_entropy(logits.view(-1, cfg["vocab_size"]), torch.from_numpy(y).reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        running.append(loss.item())
        last = step == steps - 1
        if (step + 1) % cfg["eval_every"] == 0 or last:
            vl = valid_loss()
            tl = sum(running) / len(running)
            running = []
            el = time.time() - t0
            log.append((step + 1, (step + 1) * batch * seq, round(el, 1), lr_at(step), round(tl, 4), round(vl, 4)))
            print(f"step {step + 1}/{steps}  {el / 60:.1f} min  train {tl:.3f}  valid {vl:.3f} "
                  f"(ppl {math.exp(vl):.1f})", flush=True)
            torch.save(model.state_dict(), work / "kjv.pt")
            with open(work / "kjv-loss.csv", "w", newline="") as f:
                csv.writer(f).writerows(log)
    print(f"trained in {(time.time() - t0) / 60:.1f} min")


# ---------------------------------------------------------------------------------------------
# export


def stage_export(cfg, work, out_dir):
    import torch
    from gguf import GGUFValueType as VT

    import gguf_bitnet as g

    sp = processor(work)
    model = build_model(cfg)
    model.load_state_dict(torch.load(work / "kjv.pt"))
    sd = {k: v.detach().double().numpy() for k, v in model.state_dict().items()}

    n_vocab = sp.get_piece_size()
    tokens, scores, types = [], [], []
    for i in range(n_vocab):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        types.append(2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i) else 1)
    a = g.ARCH
    d, n_head = cfg["n_embd"], cfg["n_head"]
    kvs = [
        g.kv_string("general.architecture", a),
        g.kv_string("general.name", "hesper-kjv"),
        g.kv_string("general.description", "Tiny BitNet b1.58 model trained on the King James Bible "
                    "(models/train_kjv.py in hesper-rs)"),
        g.kv_u32(f"{a}.vocab_size", n_vocab), g.kv_u32(f"{a}.context_length", cfg["n_ctx"]),
        g.kv_u32(f"{a}.embedding_length", d), g.kv_u32(f"{a}.block_count", cfg["n_layer"]),
        g.kv_u32(f"{a}.feed_forward_length", cfg["n_ff"]), g.kv_u32(f"{a}.rope.dimension_count", d // n_head),
        g.kv_u32(f"{a}.attention.head_count", n_head), g.kv_u32(f"{a}.attention.head_count_kv", cfg["n_head_kv"]),
        g.kv_f32(f"{a}.attention.layer_norm_rms_epsilon", cfg["rms_eps"]),
        g.kv_f32(f"{a}.rope.freq_base", cfg["rope_theta"]),
        g.kv_string("tokenizer.ggml.model", "llama"),
        g.kv_array("tokenizer.ggml.tokens", VT.STRING, tokens),
        g.kv_array("tokenizer.ggml.scores", VT.FLOAT32, scores),
        g.kv_array("tokenizer.ggml.token_type", VT.INT32, types),
        g.kv_u32("tokenizer.ggml.bos_token_id", sp.bos_id()),
        g.kv_u32("tokenizer.ggml.eos_token_id", sp.eos_id()),
        g.kv_u32("tokenizer.ggml.unknown_token_id", sp.unk_id()),
        g.kv_bool("tokenizer.ggml.add_bos_token", True),
        g.kv_bool("tokenizer.ggml.add_eos_token", False),
    ]
    f32 = lambda v: np.asarray(v, dtype=np.float32).tobytes()
    tensors = [
        ("token_embd.weight", [d, n_vocab], 1, np.asarray(sd["token_embd.weight"], dtype=np.float16).tobytes()),
        ("output_norm.weight", [d], 0, f32(sd["output_norm.weight"])),
    ]
    for il in range(cfg["n_layer"]):
        p = f"blocks.{il}."
        for norm in ("attn_norm", "attn_sub_norm", "ffn_norm", "ffn_sub_norm"):
            w = sd[p + norm + ".weight"]
            tensors.append((f"blk.{il}.{norm}.weight", [len(w)], 0, f32(w)))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"):
            w = torch.from_numpy(sd[p + name + ".weight"]).float()  # the trainer's f32 arithmetic
            beta = w.abs().mean().clamp(min=1e-5)
            t = (w / beta).round().clamp(-1, 1).to(torch.int8).numpy()
            rows, cols = t.shape
            tensors.append((f"blk.{il}.{name}.weight", [cols, rows], g.I2_S, g.i2s(t, float(beta))))
    out = out_dir / "hesper-kjv.gguf"
    g.write(out, kvs, tensors)
    print("wrote", out, out.stat().st_size, "bytes")

    valid = json.loads((work / "chapters-valid.json").read_text())
    (out_dir / "kjv-valid.txt").write_text("".join(" ".join(c) + "\n" for c in valid))
    export_curve(work, out_dir)


def export_curve(work, out_dir):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(csv.DictReader(open(work / "kjv-loss.csv")))
    (out_dir / "kjv-loss.csv").write_text((work / "kjv-loss.csv").read_text())
    tok = [int(r["tokens"]) / 1e6 for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(tok, [float(r["train_loss"]) for r in rows], label="training (mean since last point)")
    ax.plot(tok, [float(r["valid_loss"]) for r in rows], label="held out (every 20th chapter)")
    ax.set_xlabel("training tokens (millions)")
    ax.set_ylabel("cross-entropy (nats per token)")
    ax.set_title("hesper-kjv: BitNet b1.58, trained on the CPU (models/train_kjv.py)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_dir / "kjv-loss.png", dpi=100)


def stage_reference(cfg, work, out_dir):
    """kjv-reference.json (+ .logits.f32): the trainer's own ids for held-out text and its float logits for a
    prompt, so the tests can check that the engine tokenizes and computes as the trainer did."""
    import torch

    sp = processor(work)
    model = build_model(cfg)
    model.load_state_dict(torch.load(work / "kjv.pt"))
    model.eval()
    valid = json.loads((work / "chapters-valid.json").read_text())
    texts = [" ".join(c) for c in valid[:3]]
    prompt = "In the beginning God created the heaven and the earth. And the earth was without form"
    ids = [sp.bos_id()] + sp.encode(prompt)
    with torch.no_grad():
        logits = model(torch.tensor([ids]))[0].double().numpy()
    ref = {
        "source": "models/train_kjv.py --stage reference: SentencePiece ids and the PyTorch float32 forward",
        "texts": [{"text": t, "ids": sp.encode(t)} for t in texts],
        "prompt": {"text": prompt, "ids": ids, "logits": "kjv-reference.logits.f32"},
    }
    logits.astype("<f4").tofile(out_dir / "kjv-reference.logits.f32")  # [len(ids)][n_vocab]
    (out_dir / "kjv-reference.json").write_text(json.dumps(ref))
    print("wrote", out_dir / "kjv-reference.json")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(ROOT / "models/kjv.json"))
    ap.add_argument("--work", default="/tmp/hesper-kjv", help="corpus, tokenizer and checkpoints")
    ap.add_argument("--out", default=str(ROOT / "models"), help="where the GGUF, text and curve go")
    ap.add_argument("--stage", choices=["all", "corpus", "tokenizer", "train", "export", "reference"], default="all")
    ap.add_argument("--steps", type=int, help="override the config's step count (for a quick try)")
    a = ap.parse_args()
    cfg = load_config(a.config)
    if a.steps:
        cfg["steps"] = a.steps
    work, out = pathlib.Path(a.work), pathlib.Path(a.out)
    work.mkdir(parents=True, exist_ok=True)
    for name, run in (("corpus", lambda: stage_corpus(cfg, work)), ("tokenizer", lambda: stage_tokenizer(cfg, work)),
                      ("train", lambda: stage_train(cfg, work)), ("export", lambda: stage_export(cfg, work, out)),
                      ("reference", lambda: stage_reference(cfg, work, out))):
        if a.stage in ("all", name):
            run()


if __name__ == "__main__":
    main()
