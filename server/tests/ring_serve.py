"""`hesper-rs serve --ring`: the OpenAI server over a ring of processes, driven by the official
`openai` client.

Usage: python server/tests/ring_serve.py PATH/TO/hesper-rs

On free 127.0.0.1 ports with the built-in model (4 layers): a master holding layers 0..1 and two
workers (1..3, 3..4). The server checks of `openai_api.py` that do not depend on what runs a
step (streaming, usage, n, stop strings, log-probabilities, logit_bias, errors, the prefix
cache, 16 concurrent streams, 64 clients' bounded load) pass against the ring; every answer of
a set of seeded requests equals `serve` on one node's, one client at a time and 8 at once, and
on a ring whose master keeps the output to itself (`--private`, every node's layers assigned),
whose embeddings (`--embeddings`) are one node's too.
A worker killed while 4 streams run (no node given its layers): with a standby, which is told
what to hold, every stream completes with the text of an unbroken run; without one each stream
ends with a server_error event naming the node, the server stays up, /health answers 503,
then 200 once the worker is started again, and its embeddings are one node's.
"""

import json
import os
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import openai_api as t  # noqa: E402  (BIN comes from the same argument)

BIN = t.BIN
check = t.check


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class Node:
    """A `hesper-rs node` worker (or standby) process."""

    def __init__(self, role, layers, listen, next_, *flags):
        given = ["--layers", layers] if layers else []
        self.listen = listen
        self.args = [BIN, "node", "--role", role, *given,
                     "--listen", f"127.0.0.1:{listen}", "--next", f"127.0.0.1:{next_}",
                     "--backend", "cpu", "-t", "1", *flags]
        self.start()

    def start(self):
        self.proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
        self.log = []
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self):
        for line in self.proc.stderr:
            self.log.append(line)

    def kill(self):
        self.proc.kill()
        self.proc.wait()


def ring(workers, standby=None, *flags, master="0..1"):
    """`serve --ring` as the master of `workers` ([(layers, flags)], in ring order; layers
    None: assigned), with a standby when `standby` is given (its layers, or "" for none given:
    it is told what to hold); the master holds `master` (or "auto"). Returns the server and
    the nodes."""
    ports = free_ports(len(workers) + 2)
    master_port, spare = ports[0], ports[-1]
    nodes = []
    for i, (layers, wflags) in enumerate(workers):
        nxt = ports[i + 2] if i + 1 < len(workers) else master_port
        nodes.append(Node("worker", layers, ports[i + 1], nxt, *wflags))
    extra = []
    if standby is not None:
        nodes.append(Node("standby", standby, spare, master_port))
        extra = ["--standby", f"127.0.0.1:{spare}"]
    srv = t.Server("--ring", "--layers", master, "--listen", f"127.0.0.1:{master_port}",
                   "--next", f"127.0.0.1:{ports[1]}", "--backend", "cpu", "-t", "1",
                   *extra, *flags)
    return srv, nodes


def answers(c, reqs, clients):
    """Each request's text and token log-probabilities, with `clients` at once."""
    def one(r):
        prompt, seed, temp = r
        out = c.completions.create(model="x", prompt=prompt, max_tokens=24, temperature=temp,
                                   seed=seed, logprobs=2)
        lp = out.choices[0].logprobs
        return out.choices[0].text, lp.tokens, lp.token_logprobs
    with ThreadPoolExecutor(clients) as ex:
        return list(ex.map(one, reqs))


EMBED = ["In the beginning God created the heaven and the earth.", "Hear, O Israel",
         "And the LORD spake unto Moses, saying"]


def embeddings(c):
    """The embeddings of EMBED, as float lists."""
    return [d.embedding for d in c.embeddings.create(model="x", input=EMBED).data]


def same_as_one_node():
    prompts = ["In the beginning", "And it came to pass, when the king heard",
               "The LORD is my shepherd", "Hear, O Israel"]
    reqs = [(prompts[i % 4], 40 + i, 0.0 if i % 3 == 0 else 0.9) for i in range(16)]
    local = t.Server("-np", "8", "-c", "256", "--api-key", t.KEY, "--backend", "cpu", "-t", "1",
                     "--embeddings")
    try:
        expect = answers(local.client(), reqs, 1)
        vectors = embeddings(local.client())
    finally:
        local.stop()
    srv, nodes = ring([("1..3", []), ("3..4", [])], None, "-np", "8", "-c", "256",
                      "--api-key", t.KEY, "--metrics", "--timeout", "2")
    try:
        c = srv.client()
        for clients in (1, 8):
            got = answers(c, reqs, clients)
            check(got == expect, f"the ring's answers with {clients} client(s) equal one node's")
        check(len({a[0] for a in expect}) > 8, "the requests' answers differ")
        # The checks of a server that do not depend on what runs a step.
        t.api(srv, c)
        t.errors(srv)
        t.concurrency(srv, c)
        t.load(srv, c)
        props = json.loads(srv.get("/props")[1])
        check(len(props.get("ring", [])) == 3, f"/props names the ring's nodes: {props}")
        check(srv.metric("hesper_steps_total") > 0, "steps counted")
    finally:
        srv.stop()
        for n in nodes:
            n.kill()
    # The master keeping the output to itself (--private), every node's layers assigned.
    srv, nodes = ring([(None, []), (None, [])], None, "-np", "8", "-c", "256",
                      "--api-key", t.KEY, "--private", "--embeddings", master="auto")
    try:
        got = answers(srv.client(), reqs, 8)
        check(got == expect, "a private ring's answers equal one node's")
        check(embeddings(srv.client()) == vectors, "a private ring's embeddings equal one node's")
    finally:
        srv.stop()
        for n in nodes:
            n.kill()
    return vectors


def streams(srv, n, max_tokens):
    """`n` concurrent streamed completions: each one's text and the error it ended with."""
    c = srv.client()

    def one(i):
        text, error = "", None
        try:
            for ch in c.completions.create(model="x", prompt=f"And it came to pass {i}",
                                           max_tokens=max_tokens, temperature=0.8, seed=i,
                                           stream=True):
                if ch.choices:
                    text += ch.choices[0].text
        except Exception as e:  # noqa: BLE001 - the error is what is checked
            error = e
        return text, error
    ex = ThreadPoolExecutor(n)
    futures = [ex.submit(one, i) for i in range(n)]
    ex.shutdown(wait=False)
    return futures


def kill_mid_stream(srv, worker, futures):
    """Kills `worker` once the server has generated some tokens of every stream."""
    deadline = time.time() + 60
    while (srv.metric("hesper_tokens_generated_total") or 0) < 64:
        check(time.time() < deadline, "the streams never started")
        if time.time() > deadline:
            break
        time.sleep(0.01)
    worker.kill()
    done = srv.metric("hesper_tokens_generated_total")
    check(done < 200, f"the worker was killed mid-stream ({done} tokens generated)")
    return [f.result(timeout=120) for f in futures]


def failover(vectors):
    n, max_tokens = 4, 400
    local = t.Server("-np", "4", "-c", "1024", "--api-key", t.KEY, "--backend", "cpu", "-t", "1")
    try:
        expect = [f.result() for f in streams(local, n, max_tokens)]
    finally:
        local.stop()
    check(all(e is None and len(x) > 200 for x, e in expect), "unbroken streams")
    flags = ("-np", "4", "-c", "1024", "--api-key", t.KEY, "--metrics")
    # With a standby: every stream completes with the text of an unbroken run. No node is
    # given its layers: the master assigns them, and tells the standby what to hold.
    srv, nodes = ring([(None, [])], "", *flags, master="auto")
    try:
        got = kill_mid_stream(srv, nodes[0], streams(srv, n, max_tokens))
        check(got == expect, f"with a standby every stream is unbroken: {[g[1] for g in got]}")
        check(any("re-forming the ring through the standby" in l for l in srv.log),
              f"the master says it re-forms: {srv.log[-5:]}")
        check(any("layers assigned by measurement" in l for l in srv.log),
              f"the master prints its plan: {srv.log[:8]}")
        check(any("standby for layers" in l for l in nodes[1].log),
              f"the standby is told what to hold: {nodes[1].log}")
    finally:
        srv.stop()
        for node in nodes:
            node.kill()
    # Without one: error events naming the node, the server up, /health 503, then 200 once
    # the worker is back.
    srv, nodes = ring([(None, [])], None, *flags, "--embeddings", master="auto")
    try:
        got = kill_mid_stream(srv, nodes[0], streams(srv, n, max_tokens))
        for text, e in got:
            body = getattr(e, "body", None) or {}
            message = body.get("message", "") if isinstance(body, dict) else str(body)
            named = f"127.0.0.1:{nodes[0].listen} (layers "
            check(e is not None and "is lost" in str(e) and named in str(e),
                  f"a stream ends with an error naming the node: {e!r}")
            check(body.get("type") == "server_error" if isinstance(body, dict) else False,
                  f"the error event is a server_error: {body!r} {message!r}")
        check(srv.proc.poll() is None, "the server stays up")
        status, text = srv.get("/health")
        check(status == 503 and "is lost" in text, f"/health while the ring is down: {status} {text}")
        nodes[0].start()
        deadline = time.time() + 30
        while srv.get("/health")[0] != 200 and time.time() < deadline:
            time.sleep(0.1)
        check(srv.get("/health")[0] == 200, "/health is 200 once the worker is back")
        again = [f.result() for f in streams(srv, 1, 24)]
        check(again[0][1] is None and len(again[0][0]) > 0, f"served again: {again}")
        check(embeddings(srv.client()) == vectors, "the ring formed again gives one node's embeddings")
    finally:
        srv.stop()
        for node in nodes:
            node.kill()


def main():
    vectors = same_as_one_node()
    failover(vectors)
    if t.FAILURES:
        print(f"{len(t.FAILURES)} check(s) failed")
        sys.exit(1)
    print("all ring server checks passed")


if __name__ == "__main__":
    main()
