"""Times llama.cpp on a GGUF the way `hesper-rs bench` times hesper-rs, for side-by-side tables.

llama-cpp-python (PyPI, built from source, vendoring llama.cpp 0c1e57098) exposes llama.cpp's
C API; llama-bench itself is not part of that package. This script mirrors llama-bench's two
tests: ppN = one llama_decode of N prompt tokens; tgN = N llama_decode calls of one token.

    python benches/llama_cpp_bench.py MODEL.gguf [-p 128] [-n 64] [-r 3] [-t 2] [--json]
"""
import argparse
import json
import statistics
import time

from llama_cpp import llama_cpp as C


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("-p", type=int, default=128)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("-r", type=int, default=3)
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    C.llama_backend_init()
    mp = C.llama_model_default_params()
    mp.n_gpu_layers = 0
    model = C.llama_model_load_from_file(a.model.encode(), mp)
    if not model:
        raise SystemExit(f"llama.cpp cannot load {a.model}")
    n_vocab = C.llama_vocab_n_tokens(C.llama_model_get_vocab(model))
    ids = [(i * 2654435761 + 1) % n_vocab for i in range(max(a.p, a.n))]

    def context(n_ctx, n_batch):
        cp = C.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = n_ctx, n_batch, n_batch
        cp.n_threads = cp.n_threads_batch = a.t
        return C.llama_init_from_model(model, cp)

    def decode(ctx, tokens, pos0):
        batch = C.llama_batch_init(len(tokens), 0, 1)
        for i, tok in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, pos0 + i, 1
            batch.seq_id[i][0], batch.logits[i] = 0, int(i == len(tokens) - 1)
        batch.n_tokens = len(tokens)
        rc = C.llama_decode(ctx, batch)
        C.llama_batch_free(batch)
        if rc != 0:
            raise SystemExit(f"llama_decode failed: {rc}")

    rows = []
    if a.p:
        tps = []
        for _ in range(a.r):
            ctx = context(a.p, a.p)
            t0 = time.perf_counter()
            decode(ctx, ids[: a.p], 0)
            tps.append(a.p / (time.perf_counter() - t0))
            C.llama_free(ctx)
        rows.append((f"pp{a.p}", tps))
    if a.n:
        tps = []
        for _ in range(a.r):
            ctx = context(a.n, 1)
            t0 = time.perf_counter()
            for i in range(a.n):
                decode(ctx, [ids[i]], i)
            tps.append(a.n / (time.perf_counter() - t0))
            C.llama_free(ctx)
        rows.append((f"tg{a.n}", tps))
    if a.json:
        print(json.dumps([{"test": t, "avg_ts": statistics.mean(v), "samples_ts": v} for t, v in rows], indent=1))
    else:
        for t, v in rows:
            sd = statistics.stdev(v) if len(v) > 1 else 0.0
            print(f"| llama.cpp 0c1e57098 | {a.model} | {a.t} threads | {t} | {statistics.mean(v):.2f} ± {sd:.2f} |")
    C.llama_model_free(model)


if __name__ == "__main__":
    main()
