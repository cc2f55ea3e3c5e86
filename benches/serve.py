"""Serving benchmark: aggregate generated tokens/s (over the whole run, and while every stream
decodes), time to first token (p50/p99) and time per output token of N concurrent streaming clients against OpenAI-compatible servers (hesper-rs
serve, llama-server), rounds interleaved between servers; then the prefix cache: time to first
token of a long prompt cold and re-submitted.

Usage: python benches/serve.py NAME=URL [NAME=URL ...] [--clients 1,4,8,16] [--tokens 64]
       [--prompt-words 24] [--rounds 2] [--long-words 700]   (--long-words 0: no prefix-cache table)
Standard library only. Prints a Markdown table.
"""

import argparse
import http.client
import json
import statistics
import threading
import time
import urllib.parse

WORDS = ("and the LORD spake unto Moses saying speak unto the children of Israel that they "
         "bring me an offering of every man that giveth it willingly with his heart ye shall "
         "take my offering").split()


def prompt(words, salt):
    return " ".join(WORDS[(i * 7 + salt) % len(WORDS)] for i in range(words))


def stream(url, body):
    """One streamed completion: (seconds to the first token, seconds at each token, tokens)."""
    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    start = time.perf_counter()
    c.request("POST", "/v1/completions", json.dumps({**body, "stream": True}),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200, r.read()
    times = []
    for line in r:
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        d = json.loads(line[6:])
        for ch in d.get("choices", []):
            if ch.get("text"):
                times.append(time.perf_counter() - start)
    c.close()
    return times


def round_(url, clients, tokens, words, salt):
    results = [None] * clients

    def client(i):
        body = {"prompt": prompt(words, salt + i), "max_tokens": tokens, "temperature": 0.8,
                "seed": i, "ignore_eos": True, "cache_prompt": False}
        results[i] = stream(url, body)

    t0 = time.perf_counter()
    ts = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.perf_counter() - t0
    n = sum(len(r) for r in results)
    ttft = [r[0] for r in results if r]
    tpot = [(r[-1] - r[0]) / (len(r) - 1) for r in results if len(r) > 1]
    # Every stream's decode rate (its tokens after the first over the time they took), summed:
    # what the server generates while all of them decode at once.
    decode = sum((len(r) - 1) / (r[-1] - r[0]) for r in results if len(r) > 1 and r[-1] > r[0])
    return n / wall, ttft, tpot, decode


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("servers", nargs="+")
    ap.add_argument("--clients", default="1,4,8,16")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompt-words", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--long-words", type=int, default=700)
    a = ap.parse_args()
    servers = [s.split("=", 1) for s in a.servers]
    for _, url in servers:  # warm up
        round_(url, 2, 4, a.prompt_words, 999)
    rows = {}
    for r in range(a.rounds):
        for c in map(int, a.clients.split(",")):
            for name, url in servers:
                tps, ttft, tpot, decode = round_(url, c, a.tokens, a.prompt_words, 100 * r + c)
                rows.setdefault((name, c), []).append((tps, ttft, tpot, decode))
    print("| server | clients | aggregate t/s | decode t/s | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for c in map(int, a.clients.split(",")):
        for name, _ in servers:
            runs = rows[(name, c)]
            tps = statistics.median(x[0] for x in runs)
            decode = statistics.median(x[3] for x in runs)
            ttft = [t for x in runs for t in x[1]]
            tpot = [t for x in runs for t in x[2]]
            print(f"| {name} | {c} | {tps:.1f} | {decode:.1f} | {pct(ttft, 50) * 1e3:.0f} | {pct(ttft, 99) * 1e3:.0f} | {pct(tpot, 50) * 1e3:.1f} |")
    if a.long_words == 0:
        return
    print()
    print("| server | long prompt | cold TTFT ms | re-submitted TTFT ms | ratio |")
    print("|---|---:|---:|---:|---:|")
    for name, url in servers:
        body = {"prompt": prompt(a.long_words, 7), "max_tokens": 1, "temperature": 0, "cache_prompt": True}
        cold = stream(url, body)[0]
        warm = min(stream(url, body)[0] for _ in range(3))
        print(f"| {name} | {a.long_words} words | {cold * 1e3:.0f} | {warm * 1e3:.0f} | {cold / warm:.1f}× |")


if __name__ == "__main__":
    main()
