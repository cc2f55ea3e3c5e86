"""Perplexity as llama.cpp's `llama-perplexity` computes it, from llama.cpp's own logits.

For every golden model whose reference is llama.cpp (generate.py's BitNet files, families.py's
other families and llama.cpp's quantized files), the committed logits of its sequence s2
(BOS + 32 tokens, llama.cpp 0c1e57098, all positions) are scored the way
`tools/perplexity/perplexity.cpp` scores one chunk of `n_ctx` = 32 tokens: positions
first = n_ctx/2 .. n_ctx-2 predict the next token, NLL per token from `log_softmax` (max logit,
sum of exp in double), PPL = exp(mean NLL), error = sqrt(var / (count-1)) * PPL. The chunk's first
token is BOS already, which is what llama-perplexity puts there.

`tests/tests/perplexity.rs` runs `hesper_runtime::perplexity` on the same tokens and compares.

    python golden-values/perplexity_reference.py      # writes golden-values/out/perplexity.json
Needs numpy only; reads what generate.py wrote.
"""
import json
import math
import pathlib

import numpy as np

OUT = pathlib.Path(__file__).resolve().parent / "out"
SEQUENCE = 2
N_CTX = 32


def chunk_nll(logits, tokens, n_ctx):
    """NLLs of one chunk's scored tokens, as perplexity.cpp's process_logits/log_softmax."""
    first = n_ctx // 2
    out = []
    for j in range(first, n_ctx - 1):
        row = logits[j].astype(np.float32)
        mx = row.max()
        sum_exp = float(np.exp((row - mx).astype(np.float32)).astype(np.float64).sum())
        out.append(-(float(row[tokens[j + 1]]) - float(mx) - math.log(sum_exp)))
    return out


def main():
    models = {}
    for manifest in sorted(OUT.glob("*.json")):
        d = json.loads(manifest.read_text())
        if ("sequences" not in d or not d["reference"].startswith("llama.cpp")
                or len(d["sequences"]) <= SEQUENCE):
            continue
        seq = d["sequences"][SEQUENCE]
        tokens = seq["tokens"]
        assert len(tokens) >= N_CTX and tokens[0] == 1, manifest
        logits = np.fromfile(OUT / seq["logits"], dtype="<f4").reshape(len(tokens), d["n_vocab"])
        nll = chunk_nll(logits, tokens[:N_CTX], N_CTX)
        count = len(nll)
        mean = sum(nll) / count
        var = sum(v * v for v in nll) / count - mean * mean
        ppl = math.exp(mean)
        models[manifest.stem] = {
            "ppl": ppl,
            "err": math.sqrt(var / (count - 1)) * ppl,
            "nll": nll,
        }
    result = {
        "source": "llama-perplexity's arithmetic (perplexity.cpp: one chunk, second half scored) applied to "
                  "the committed llama.cpp 0c1e57098 logits of sequence s2",
        "sequence": SEQUENCE,
        "n_ctx": N_CTX,
        "models": models,
    }
    (OUT / "perplexity.json").write_text(json.dumps(result, indent=1) + "\n")
    for name, m in models.items():
        print(f"{name}: PPL = {m['ppl']:.4f} +/- {m['err']:.5f}")


if __name__ == "__main__":
    main()
