"""`hesper-rs serve` driven by the official `openai` Python client and by raw HTTP.

Usage: python server/tests/openai_api.py PATH/TO/hesper-rs

Starts servers on free 127.0.0.1 ports with the built-in model and checks every endpoint and
field docs/server.md lists: streamed text equals non-streamed, the chunk sequence and `usage` as
OpenAI defines them, each error with its status and JSON, 16 concurrent clients getting what
each gets alone, a disconnect freeing its sequence, a full queue answering 503, a shared system
prompt served from the prefix cache, a slow client dropped while others are served, a
bounded load test (no error, no lost or duplicated token, memory back to its level),
structured outputs (JSON schemas, json_object, GBNF: every answer valid, unconstrained
batch-mates unchanged), tool calls (`tool_choice` enforced, streamed calls equal to the whole), LangChain's
`with_structured_output` and `bind_tools`, thoughts in `reasoning_content`,
the Responses API (`responses.create`, streamed events),
`--hot-swap`'s swaps on /health (shared, spaced checks) and POST /reload, a hostile chat
template, the request log lines (text, and JSON with bodies under -v), llama-server's /infill
(its prompt layout, on a copy of the built-in model with fill-in-the-middle tokens) and /slots,
and the chat page's files and the switches that turn it and /slots off.
"""

import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import jsonschema
from openai import OpenAI, APIStatusError

BIN = sys.argv[1]
KEY = "test-key"
FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print(f"FAIL: {what}", flush=True)


class Server:
    """A `hesper-rs serve` process on a free port."""

    def __init__(self, *flags):
        # A GPU server runs on whatever Vulkan driver there is (lavapipe in CI).
        env = {"WGPU_BACKEND": "vulkan", **os.environ}
        env.setdefault("XDG_RUNTIME_DIR", tempfile.mkdtemp())
        self.proc = subprocess.Popen(
            [BIN, "serve", "--port", "0", *flags],
            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
        self.port = None
        self.log = []
        for line in self.proc.stderr:
            self.log.append(line)
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
        assert self.port, "".join(self.log)
        threading.Thread(target=self._drain, daemon=True).start()
        deadline = time.time() + 60
        while self.get("/health")[0] != 200:
            assert time.time() < deadline, "the model never loaded"
            time.sleep(0.05)

    def _drain(self):
        for line in self.proc.stderr:
            self.log.append(line)

    def request(self, method, path, body=None, headers=None, raw=None):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        h = {"Content-Type": "application/json", **(headers or {})}
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        c.request(method, path, body=data, headers=h)
        r = c.getresponse()
        text = r.read().decode()
        c.close()
        return r.status, text, r

    def get(self, path, key=KEY):
        s, t, _ = self.request("GET", path, headers={"Authorization": f"Bearer {key}"})
        return s, t

    def post(self, path, body, key=KEY, **kw):
        return self.request("POST", path, body, {"Authorization": f"Bearer {key}"}, **kw)

    def client(self):
        return OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key=KEY, max_retries=0)

    def rss_kib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))

    def metric(self, name):
        _, text = self.get("/metrics")
        m = re.search(rf"^{name} (\S+)$", text, re.M)
        return float(m.group(1)) if m else None

    def metric_becomes(self, name, value, seconds=10):
        """Whether metric `name` reads `value` within `seconds` (gauges change at step ends)."""
        deadline = time.time() + seconds
        while self.metric(name) != value and time.time() < deadline:
            time.sleep(0.01)
        return self.metric(name) == value

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def error_of(status_text, status, param=None):
    status_got, text = status_text[0], status_text[1]
    check(status_got == status, f"status {status_got} (want {status}): {text[:200]}")
    try:
        e = json.loads(text)["error"]
    except (ValueError, KeyError):
        check(False, f"not an OpenAI error body: {text[:200]}")
        return {}
    check(all(k in e for k in ("message", "type", "param", "code")), f"error fields: {e}")
    if param is not None:
        check(e["param"] == param, f"param {e['param']!r} (want {param!r})")
    return e


def chat(c, content, **kw):
    return c.chat.completions.create(
        model="x", messages=[{"role": "user", "content": content}], **kw)


def streamed_chat(c, content, **kw):
    chunks = list(chat(c, content, stream=True, **kw))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    return text, chunks


def main():
    srv = Server("--api-key", KEY, "--metrics", "-np", "8", "--timeout", "2", "-c", "256")
    c = srv.client()
    try:
        api(srv, c)
        request_logs(srv, c, json_lines=False)
        native_completion(srv, c)
        errors(srv)
        concurrency(srv, c)
        structured(srv, c)
        slow_client(srv)
        load(srv, c)
    finally:
        srv.stop()
    busy = Server("-np", "1", "--queue", "1", "-c", "4096", "--metrics", "--api-key", KEY)
    try:
        full_queue_and_disconnect(busy)
    finally:
        busy.stop()
    # The tools' system turn outgrows the first server's 256 positions.
    agent = Server("-np", "4", "-c", "1024", "--api-key", KEY, "--embeddings",
                   "--log-format", "json", "-v")
    try:
        request_logs(agent, agent.client(), json_lines=True)
        tool_calls(agent, agent.client())
        langchain(agent)
        reasoning(agent, agent.client())
        responses(agent, agent.client())
        messages(agent, agent.client())
        embeddings(agent, agent.client())
    finally:
        agent.stop()
    native_tools()
    harmony()
    gpu = Server("--backend", "gpu", "-np", "4", "--api-key", KEY)
    try:
        on_the_gpu(gpu)
    finally:
        gpu.stop()
    hot_swap()
    cors()
    hostile_template()
    infill()
    switches()
    if FAILURES:
        print(f"{len(FAILURES)} check(s) failed")
        sys.exit(1)
    print("all server checks passed")


def api(srv, c):
    # Not streamed and streamed give the same text (greedy, then seeded sampling).
    r = chat(c, "Who is the LORD?", max_tokens=12, temperature=0)
    text, chunks = streamed_chat(c, "Who is the LORD?", max_tokens=12, temperature=0,
                                 stream_options={"include_usage": True})
    check(r.choices[0].message.content == text, f"stream {text!r} vs {r.choices[0].message.content!r}")
    check(r.choices[0].message.role == "assistant", "role")
    check(r.choices[0].finish_reason == "length", f"finish {r.choices[0].finish_reason}")
    check(r.usage.completion_tokens == 12, f"usage {r.usage}")
    check(r.usage.total_tokens == r.usage.prompt_tokens + 12, "total tokens")
    check(r.object == "chat.completion" and r.id.startswith("chatcmpl-"), "object and id")
    # The chunk sequence: role first, content deltas, finish_reason, then usage with no choices.
    check(chunks[0].choices[0].delta.role == "assistant", "first chunk has the role")
    check(chunks[-2].choices[0].finish_reason == "length", "finish chunk")
    check(chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12, "usage chunk")
    check(all(ch.usage is None for ch in chunks[:-1]), "usage null before the last chunk")
    check(all(ch.object == "chat.completion.chunk" for ch in chunks), "chunk objects")
    check(len({ch.id for ch in chunks}) == 1, "one id per stream")
    a = chat(c, "Hear, O Israel", max_tokens=16, temperature=0.9, seed=7).choices[0].message.content
    b, _ = streamed_chat(c, "Hear, O Israel", max_tokens=16, temperature=0.9, seed=7)
    d = chat(c, "Hear, O Israel", max_tokens=16, temperature=0.9, seed=8).choices[0].message.content
    check(a == b, f"seeded stream {a!r} vs {b!r}")
    check(a != d, "another seed differs")
    # Raw SSE: the last event is [DONE].
    s, body, resp = srv.post("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "stream": True})
    check(resp.getheader("Content-Type", "").startswith("text/event-stream"), "SSE type")
    check(body.rstrip().endswith("data: [DONE]"), f"ends with [DONE]: {body[-80:]!r}")
    # Text completion: a list of prompts with n answers each, indexed prompt-major.
    r = c.completions.create(model="x", prompt=["And God said", "In the beginning"], n=2,
                             max_tokens=5, temperature=0.8, seed=3)
    check([ch.index for ch in r.choices] == [0, 1, 2, 3], "choice indices")
    check(r.usage.completion_tokens == 20, f"n x prompts tokens {r.usage}")
    one = c.completions.create(model="x", prompt="And God said", max_tokens=5, temperature=0.8, seed=3)
    check(one.choices[0].text == r.choices[0].text, "answer 0 of a list equals the prompt alone")
    # Stop strings, across token boundaries, never sent.
    full = c.completions.create(model="x", prompt="And it came to pass", max_tokens=24, temperature=0).choices[0].text
    stop = full[5:9]
    cut = c.completions.create(model="x", prompt="And it came to pass", max_tokens=24, temperature=0, stop=[stop, "zzz"])
    check(cut.choices[0].text == full[:full.index(stop)], f"stop {stop!r}: {cut.choices[0].text!r} of {full!r}")
    check(cut.choices[0].finish_reason == "stop", "stop's finish_reason")
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(
        model="x", prompt="And it came to pass", max_tokens=24, temperature=0, stop=stop, stream=True) if ch.choices)
    check(streamed == cut.choices[0].text, "streamed stop")
    # Log-probabilities.
    r = chat(c, "Hi", max_tokens=4, temperature=0, logprobs=True, top_logprobs=3)
    lp = r.choices[0].logprobs.content
    check(len(lp) == 4 and all(len(t.top_logprobs) == 3 for t in lp), "chat logprobs shape")
    check(all(t.logprob <= 0 and abs(t.logprob - t.top_logprobs[0].logprob) < 1e-6 for t in lp),
          "greedy tokens are the most likely")
    r = c.completions.create(model="x", prompt="And", max_tokens=3, temperature=0, logprobs=2)
    check(len(r.choices[0].logprobs.tokens) == 3 and len(r.choices[0].logprobs.top_logprobs[0]) == 2,
          "completion logprobs shape")
    # logit_bias: +100 makes a token the greedy choice, -100 bans it.
    tokens = json.loads(srv.post("/tokenize", {"content": full[:8]})[1])["tokens"]
    lord = json.loads(srv.post("/tokenize", {"content": " LORD"})[1])["tokens"][-1]
    lord_text = json.loads(srv.post("/detokenize", {"tokens": [lord]})[1])["content"]
    forced = c.completions.create(model="x", prompt="And it came to pass", max_tokens=2, temperature=0,
                                  logit_bias={str(lord): 100}).choices[0].text
    check(forced.split() == [lord_text] * 2, f"logit_bias +100: {forced!r}, {lord_text!r}")
    banned = c.completions.create(model="x", prompt="And it came to pass", max_tokens=2, temperature=0,
                                  logit_bias={str(lord): -100, "0": 5}).choices[0].text
    check(lord_text not in banned, f"logit_bias -100: {banned!r}")
    # Biases past ±100 are brought to it: two tokens forced by 1e39 are chosen between as at
    # +100, by their own logits (at +inf alike the lowest id, token 0, always won), and every
    # token pushed down alike changes nothing (at -inf every answer was <unk>).
    the = json.loads(srv.post("/tokenize", {"content": " the"})[1])["tokens"][-1]
    pick = lambda bias, s: c.completions.create(model="x", prompt="And", max_tokens=1,
                                                temperature=1.0, seed=s, logit_bias=bias).choices[0].text
    huge = [pick({"0": 1e39, str(the): 1e39}, s) for s in range(4)]
    hundred = [pick({"0": 100, str(the): 100}, s) for s in range(4)]
    token0 = json.loads(srv.post("/detokenize", {"tokens": [0]})[1])["content"]
    check(huge == hundred and any(t != token0 for t in huge),
          f"two tokens forced by 1e39: {huge!r}, by 100: {hundred!r}")
    greedy = c.completions.create(model="x", prompt="And it came to pass", max_tokens=4,
                                  temperature=0).choices[0].text
    n_vocab = json.loads(srv.get("/v1/models")[1])["data"][0]["meta"]["n_vocab"]
    every_down = {str(t): -1e39 for t in range(n_vocab)}
    lowered = c.completions.create(model="x", prompt="And it came to pass", max_tokens=4,
                                   temperature=0, logit_bias=every_down).choices[0].text
    check(lowered == greedy, f"every token at -1e39: {lowered!r}, {greedy!r}")
    r = c.completions.create(model="x", prompt="And", max_tokens=4, presence_penalty=0.5,
                             frequency_penalty=0.5, extra_body={"top_k": 5, "min_p": 0.1,
                             "repeat_penalty": 1.1, "cache_prompt": False, "unknown_field": 1})
    check(r.usage.completion_tokens == 4, "extras accepted")
    # /tokenize and /detokenize round-trip; /v1/models; /props; /metrics.
    check(json.loads(srv.post("/detokenize", {"tokens": tokens})[1])["content"] == full[:8], "detokenize")
    pieces = json.loads(srv.post("/tokenize", {"content": "And", "with_pieces": True})[1])["tokens"]
    check("id" in pieces[0] and "piece" in pieces[0], "with_pieces")
    check(c.models.list().data[0].id == "hesper-kjv", "models")
    props = json.loads(srv.get("/props")[1])
    check(props["total_slots"] == 8 and props["default_generation_settings"]["n_ctx"] == 256, f"props {props}")
    # A shared system prompt is a cache hit for the next request.
    sysmsg = {"role": "system", "content": "Thou art a scribe of the house of David, and thou answerest in the words of the prophets."}
    c.chat.completions.create(model="x", messages=[sysmsg, {"role": "user", "content": "Who made the heaven?"}], max_tokens=2)
    r = c.chat.completions.create(model="x", messages=[sysmsg, {"role": "user", "content": "Who is the king?"}], max_tokens=2)
    check(r.usage.prompt_tokens_details.cached_tokens > 10, f"cached tokens {r.usage}")
    check(srv.metric("hesper_prompt_tokens_cached_total") > 10, "cached tokens counted")
    check(srv.metric("hesper_time_to_first_token_seconds_count") > 0, "ttft histogram")


def logged(srv, want, what):
    """The first of srv's request lines (JSON objects) for which want(line) holds, waiting a
    moment: a line is written once its answer has been sent."""
    deadline = time.time() + 5
    while time.time() < deadline:
        for line in list(srv.log):
            if line.startswith("{"):
                v = json.loads(line)
                if want(v):
                    return v
        time.sleep(0.05)
    check(False, f"no request line for {what}: {srv.log[-5:]}")
    return {}


def native_completion(srv, c):
    """llama-server's POST /completion: the text /v1/completions gives for the same request,
    streamed as its data chunks with a last `stop: true` one, n_probs with token ids, the
    stop type and word; GET /v1/models/{id}."""
    prompt = "In the beginning"
    want = c.completions.create(model="x", prompt=prompt, max_tokens=8, temperature=0)
    s, body, _ = srv.post("/completion", {"prompt": prompt, "n_predict": 8, "temperature": 0,
                                          "n_probs": 2})
    r = json.loads(body) if s == 200 else {}
    tokens = json.loads(srv.post("/tokenize", {"content": prompt, "add_special": True})[1])["tokens"]
    check(r.get("content") == want.choices[0].text and r.get("stop") is True
          and r.get("tokens_predicted") == 8 and r.get("tokens_evaluated") == len(tokens)
          and r.get("stop_type") == "limit" and r.get("timings", {}).get("predicted_n") == 8,
          f"/completion {s} {body[:400]}")
    probs = r.get("completion_probabilities", [])
    check(len(probs) == 8 and all(len(p["top_logprobs"]) == 2 and p["id"] == p["top_logprobs"][0]["id"]
                                  for p in probs)
          and "".join(p["token"] for p in probs) == r.get("content"), f"n_probs {probs[:2]}")
    # Streamed: content chunks, then the object with stop: true (no [DONE]).
    _, text, _ = srv.post("/completion", {"prompt": tokens, "n_predict": 8, "temperature": 0,
                                          "stream": True})
    chunks = [json.loads(l[6:]) for l in text.splitlines() if l.startswith("data: ")]
    check(chunks and chunks[-1].get("stop") is True and not any(ch["stop"] for ch in chunks[:-1])
          and "".join(ch["content"] for ch in chunks) == r.get("content")
          and "[DONE]" not in text, f"/completion stream {text[:400]}")
    stop = r.get("content", " x")[:3]
    s, body, _ = srv.post("/completion", {"prompt": prompt, "n_predict": 8, "temperature": 0,
                                          "stop": [stop]})
    w = json.loads(body) if s == 200 else {}
    check(w.get("stop_type") == "word" and w.get("stopping_word") == stop
          and stop not in w.get("content", stop), f"stop word {stop!r}: {body[:300]}")
    error_of(srv.post("/completion", {"n_predict": 4}), 400, "prompt")
    error_of(srv.post("/completion", {"prompt": "x", "n_predict": -2}), 400, "n_predict")
    name = json.loads(srv.get("/v1/models")[1])["data"][0]["id"]
    s, body = srv.get(f"/v1/models/{name}")
    check(s == 200 and json.loads(body)["id"] == name, f"/v1/models/{name}: {s} {body[:200]}")
    error_of(srv.get("/v1/models/no-such-model"), 404)


def request_logs(srv, c, json_lines):
    """One line per request on stderr once it is answered: method, path, status, the client's
    address, prompt (and cached) and generated tokens, time to the first token, total time;
    refused and unknown requests too. As JSON with --log-format json; -v adds the body, never
    the key."""
    ask = [{"role": "user", "content": "Who begat Enos?"}]
    c.chat.completions.create(model="x", messages=ask, max_tokens=7, temperature=0)
    list(c.chat.completions.create(model="x", messages=ask, max_tokens=9, temperature=0,
                                   stream=True))
    srv.get("/nowhere")
    srv.get("/v1/models", key="wrong-key")
    if not json_lines:
        pattern = (r"request: POST /v1/chat/completions 200 127\.0\.0\.1:\d+ \| prompt \d+ "
                   r"\(cached \d+\), generated {n}, first token [\d.]+ ms \| total [\d.]+ ms\n")
        deadline = time.time() + 5
        while time.time() < deadline and not all(
                any(re.fullmatch(pattern.format(n=n), l) for l in srv.log) for n in (7, 9)):
            time.sleep(0.05)
        for n in (7, 9):
            check(any(re.fullmatch(pattern.format(n=n), l) for l in srv.log),
                  f"a text line for {n} tokens: {srv.log[-6:]}")
        check(any(re.fullmatch(r"request: GET /nowhere 404 127\.0\.0\.1:\d+ \| total [\d.]+ ms\n", l)
                  for l in srv.log), f"a 404's line: {srv.log[-6:]}")
        return
    for n, stream in ((7, False), (9, True)):
        v = logged(srv, lambda v: v.get("generated_tokens") == n, f"{n} tokens")
        body = json.loads(v.get("body", "{}"))
        check(v.get("method") == "POST" and v.get("path") == "/v1/chat/completions"
              and v.get("status") == 200 and v.get("client", "").startswith("127.0.0.1:")
              and v.get("prompt_tokens", 0) > 0 and 0 <= v.get("cached_tokens", -1) <= v["prompt_tokens"]
              and 0 < v.get("first_token_ms", 0) <= v.get("total_ms", 0)
              and body.get("max_tokens") == n and body.get("stream", False) == stream,
              f"a JSON line: {v}")
    v = logged(srv, lambda v: v.get("path") == "/nowhere", "a 404")
    check(v.get("status") == 404 and "prompt_tokens" not in v, f"a 404's line: {v}")
    v = logged(srv, lambda v: v.get("path") == "/v1/models" and v.get("status") == 401, "a 401")
    check(not any(KEY in l or "wrong-key" in l for l in srv.log), "a key in the log")


def errors(srv):
    # A server started without --embeddings says how to get them.
    s, text, _ = srv.post("/v1/embeddings", {"input": "x"})
    check(s == 501 and "--embeddings" in text, f"embeddings off: {s} {text[:200]}")
    ok = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
    error_of(srv.post("/v1/chat/completions", ok, key="wrong"), 401)
    error_of(srv.request("POST", "/v1/chat/completions", ok), 401)
    s, _, _ = srv.request("POST", "/v1/chat/completions", ok, {"X-Api-Key": KEY})
    check(s == 200, "X-Api-Key")
    check(srv.request("GET", "/health")[0] == 200, "health is public")
    error_of(srv.post("/v1/chat/completions", None, raw="{not json"), 400)
    error_of(srv.post("/v1/chat/completions", {**ok, "temperature": "hot"}), 400, "temperature")
    error_of(srv.post("/v1/chat/completions", {**ok, "messages": [{"role": "wizard", "content": "x"}]}), 400, "messages[0].role")
    error_of(srv.post("/v1/chat/completions", {"max_tokens": 1}), 400, "messages")
    error_of(srv.post("/v1/completions", {"prompt": "x", "max_tokens": -5}), 400, "max_tokens")
    error_of(srv.post("/v1/completions", {"prompt": "x", "n": 0}), 400, "n")
    error_of(srv.post("/v1/completions", {"prompt": "x", "top_p": 2}), 400, "top_p")
    error_of(srv.post("/v1/completions", {"prompt": "x", "logit_bias": {"999999": 1}}), 400, "logit_bias")
    error_of(srv.post("/v1/completions", {"prompt": [99999999]}), 400, "prompt")
    error_of(srv.post("/detokenize", {"tokens": [-1]}), 400, "tokens")
    e = error_of(srv.post("/v1/completions", {"prompt": "And the LORD said " * 100}), 400)
    check(e.get("n_ctx") == 256 and e.get("n_prompt_tokens", 0) > 256, f"context error {e}")
    error_of(srv.get("/v1/nothing"), 404)
    error_of(srv.request("DELETE", "/v1/models", headers={"Authorization": f"Bearer {KEY}"})[:2], 405)
    error_of(srv.post("/v1/completions", None, raw="x" * (9 << 20)), 413)
    # The official client sees the same errors as exceptions with the status.
    try:
        srv.client().completions.create(model="x", prompt="x", temperature=float("nan"))
        check(False, "NaN temperature accepted")
    except (APIStatusError, ValueError) as e:
        check(getattr(e, "status_code", 400) == 400, f"NaN temperature: {e}")
    check(srv.proc.poll() is None, "the server survived every bad request")


def concurrency(srv, c):
    # 16 streaming clients with different seeds get exactly what each gets alone.
    prompts = ["In the beginning", "The LORD is my shepherd", "And God said", "Hear, O Israel"]
    args = [(prompts[i % 4], 100 + i) for i in range(16)]
    run = lambda a: streamed_chat(c, a[0], max_tokens=20, temperature=0.9, seed=a[1])[0]
    alone = [run(a) for a in args]
    with ThreadPoolExecutor(16) as ex:
        together = list(ex.map(run, args))
    check(alone == together, "16 concurrent clients get what each gets alone")
    check(len(set(alone)) > 8, "seeds differ")


# Schemas the tiny model follows only because its tokens are masked: nested objects, arrays,
# enums, required fields; strings and arrays bounded so that every answer ends within its tokens.
SCHEMAS = [
    {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 969},
        "tribe": {"enum": ["Judah", "Levi", "Dan"]},
        "sons": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
        "home": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 10}, "walled": {"type": "boolean"}},
            "required": ["city", "walled"], "additionalProperties": False}},
     "required": ["name", "age", "tribe", "sons", "home"], "additionalProperties": False},
    {"type": "array", "items": {"type": "object", "properties": {
        "book": {"enum": ["Genesis", "Exodus", "Ruth"]},
        "verse": {"type": "integer", "minimum": 1, "maximum": 50}},
        "required": ["book", "verse"], "additionalProperties": False},
     "minItems": 1, "maxItems": 3},
    {"type": "object", "properties": {
        "answer": {"enum": ["yea", "nay"]},
        "weight": {"type": "integer", "minimum": -10, "maximum": 10}},
     "required": ["answer", "weight"], "additionalProperties": False},
    {"$defs": {"coin": {"type": "object", "properties": {
        "metal": {"enum": ["gold", "silver"]}, "shekels": {"type": "integer", "minimum": 1,
                                                          "maximum": 30}},
        "required": ["metal", "shekels"], "additionalProperties": False}},
     "type": "object", "properties": {"price": {"$ref": "#/$defs/coin"},
                                      "paid": {"anyOf": [{"$ref": "#/$defs/coin"}, {"type": "null"}]}},
     "required": ["price", "paid"], "additionalProperties": False},
]


def schema_format(i):
    return {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": SCHEMAS[i], "strict": True}}


def structured(srv, c):
    # Each schema, streamed and not, sampled and greedy: the answer parses and validates.
    for i, schema in enumerate(SCHEMAS):
        for kw in ({"temperature": 0}, {"temperature": 0.9, "seed": 5 + i}):
            r = chat(c, "Tell me of the house of David", max_tokens=120,
                     response_format=schema_format(i), **kw)
            text = r.choices[0].message.content
            streamed, _ = streamed_chat(c, "Tell me of the house of David", max_tokens=120,
                                        response_format=schema_format(i), **kw)
            check(streamed == text, f"schema {i} streamed {streamed!r} vs {text!r}")
            check(r.choices[0].finish_reason == "stop", f"schema {i} ends by its grammar: {text!r}")
            try:
                jsonschema.validate(json.loads(text), schema)
            except (ValueError, jsonschema.ValidationError) as e:
                check(False, f"schema {i} answer {text!r}: {e}")
    # 8 concurrent requests with different schemas beside 8 unconstrained ones: every answer
    # valid, and the unconstrained ones' text what each gets alone.
    free = lambda k: chat(c, ["And God said", "Hear, O Israel"][k % 2], max_tokens=16,
                          temperature=0.9, seed=300 + k).choices[0].message.content
    alone = [free(k) for k in range(8)]

    def job(k):
        if k % 2:
            return free(k // 2)
        i = (k // 2) % len(SCHEMAS)
        return chat(c, "Who begat whom?", max_tokens=120, temperature=0.9, seed=400 + k,
                    response_format=schema_format(i)).choices[0].message.content
    with ThreadPoolExecutor(16) as ex:
        together = list(ex.map(job, range(16)))
    check(together[1::2] == alone, "unconstrained answers beside constrained ones are unchanged")
    for k in range(0, 16, 2):
        i = (k // 2) % len(SCHEMAS)
        try:
            jsonschema.validate(json.loads(together[k]), SCHEMAS[i])
        except (ValueError, jsonschema.ValidationError) as e:
            check(False, f"concurrent schema {i} answer {together[k]!r}: {e}")
    check(any(json.loads(t) for t in together[0::2]), "answers have content")
    # Unconstrained, the model does not write JSON: the mask is what makes it.
    try:
        json.loads(alone[0])
        check(False, f"the model wrote JSON unasked: {alone[0]!r}")
    except ValueError:
        pass
    # json_object: any JSON object; n answers each valid.
    r = chat(c, "Hi", max_tokens=60, temperature=0.9, seed=2, n=2,
             response_format={"type": "json_object"})
    for ch in r.choices:
        try:
            check(isinstance(json.loads(ch.message.content), dict) or ch.finish_reason == "length",
                  f"json_object {ch.message.content!r}")
        except ValueError:
            check(ch.finish_reason == "length", f"json_object {ch.message.content!r} is not JSON")
    # llama-server's json_schema and grammar (GBNF) fields, on both endpoints.
    r = c.completions.create(model="x", prompt="And", max_tokens=120, temperature=0.7, seed=1,
                             extra_body={"json_schema": SCHEMAS[2]})
    jsonschema.validate(json.loads(r.choices[0].text), SCHEMAS[2])
    gbnf = 'root ::= name ", son of " name "."\nname ::= [A-Z] [a-z]{2,7}\n'
    r = chat(c, "Who is he?", max_tokens=40, temperature=0.9, seed=3, extra_body={"grammar": gbnf})
    text = r.choices[0].message.content
    check(re.fullmatch(r"[A-Z][a-z]{2,7}, son of [A-Z][a-z]{2,7}\.", text) is not None, f"GBNF {text!r}")
    # What cannot be followed is a 400 naming the field, never an unconstrained answer.
    ask = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    e = error_of(srv.post("/v1/chat/completions", {**ask, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "integer", "minimum": 5, "maximum": 1}}}}), 400, "response_format")
    check("nsatisfiable" in e.get("message", ""), f"unsatisfiable schema: {e}")
    error_of(srv.post("/v1/chat/completions", {**ask, "response_format": {"type": "yaml"}}),
             400, "response_format.type")
    error_of(srv.post("/v1/chat/completions", {**ask, "response_format": {"type": "json_schema"}}),
             400, "response_format.json_schema")
    error_of(srv.post("/v1/chat/completions", {**ask, "grammar": "root ::= [z-a]"}), 400, "grammar")
    error_of(srv.post("/v1/chat/completions", {**ask, "json_schema": {"type": "object"},
                                               "grammar": 'root ::= "a"'}), 400, "grammar")
    error_of(srv.post("/v1/chat/completions", {**ask, "json_schema": 5}), 400, "json_schema")


TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city for some days",
        "parameters": {"type": "object", "properties": {
            "city": {"enum": ["Jerusalem", "Babylon", "Nineveh"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
            "required": ["city", "days"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "The time in a zone",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 8}},
                       "required": ["zone"], "additionalProperties": False}}},
]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def valid_calls(calls, names, what, short_ids=False):
    check(calls, f"{what}: no tool calls")
    for call in calls or []:
        # Mistral's templates take only ids of 9 letters and digits.
        id_ok = re.fullmatch(r"[a-z0-9]{9}", call.id) if short_ids else call.id.startswith("call_")
        check(call.type == "function" and id_ok, f"{what}: call {call}")
        check(call.function.name in names, f"{what}: called {call.function.name}")
        try:
            jsonschema.validate(json.loads(call.function.arguments), PARAMS[call.function.name])
        except (ValueError, KeyError, jsonschema.ValidationError) as e:
            check(False, f"{what}: arguments {call.function.arguments!r}: {e}")


def streamed_answer(chunks):
    """A streamed chat answer's content and calls (name, arguments) put together, and the
    number of chunks that carried text or arguments."""
    content, calls, pieces = "", {}, 0
    for ch in chunks:
        d = ch.choices[0].delta
        content += d.content or ""
        pieces += bool(d.content)
        for t in d.tool_calls or []:
            e = calls.setdefault(t.index, ["", ""])
            e[0] += t.function.name or ""
            e[1] += t.function.arguments or ""
            pieces += bool(t.function.arguments)
    return (content, [tuple(calls[k]) for k in sorted(calls)]), pieces


def tool_calls(srv, c):
    ask = [{"role": "user", "content": "What weather shall there be in Jerusalem?"}]
    call = lambda **kw: c.chat.completions.create(model="x", messages=ask, tools=TOOLS,
                                                  max_tokens=80, **kw)
    # required: a valid call of one of the tools, finish_reason tool_calls, no content.
    for seed in range(3):
        r = call(tool_choice="required", parallel_tool_calls=False, temperature=0.9, seed=seed)
        m = r.choices[0].message
        check(r.choices[0].finish_reason == "tool_calls", f"finish {r.choices[0].finish_reason}")
        check(m.content is None and len(m.tool_calls or []) == 1, f"one call: {m}")
        valid_calls(m.tool_calls, PARAMS, f"required, seed {seed}")
    # A named function is the one called.
    named = {"type": "function", "function": {"name": "get_time"}}
    r = call(tool_choice=named, temperature=0, parallel_tool_calls=False)
    valid_calls(r.choices[0].message.tool_calls, ["get_time"], "named")
    # Streamed calls reassemble to the call made without streaming.
    whole = call(tool_choice="required", parallel_tool_calls=False, temperature=0.9, seed=11)
    calls = {}
    finish = None
    pieces = 0
    for ch in call(tool_choice="required", parallel_tool_calls=False, temperature=0.9, seed=11,
                   stream=True):
        for d in ch.choices[0].delta.tool_calls or []:
            e = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
            e["id"] = d.id or e["id"]
            e["name"] += (d.function.name or "") if d.function else ""
            e["arguments"] += (d.function.arguments or "") if d.function else ""
            pieces += bool(d.function and d.function.arguments)
        finish = ch.choices[0].finish_reason or finish
    # The arguments arrive as they are written, not in one piece at the end.
    check(pieces > 3, f"arguments streamed in {pieces} pieces")
    want = [{"id": t.id, "name": t.function.name, "arguments": t.function.arguments}
            for t in whole.choices[0].message.tool_calls]
    got = [calls[k] for k in sorted(calls)]
    check([{**g, "id": None} for g in got] == [{**w, "id": None} for w in want],
          f"streamed calls {got} vs {want}")
    check(finish == "tool_calls", f"streamed finish {finish}")
    # auto: a reply ({"response": …}, its string decoded as it streams) or a call, each streamed
    # as written and equal to the answer made without streaming.
    kinds = set()
    for seed in (0, 1):
        kw = dict(tool_choice="auto", parallel_tool_calls=False, temperature=0.9, seed=seed)
        answer = call(**kw).choices[0].message
        got, pieces = streamed_answer(call(stream=True, **kw))
        want = (answer.content or "",
                [(t.function.name, t.function.arguments) for t in answer.tool_calls or []])
        check(got == want, f"auto, seed {seed}: streamed {got} vs {want}")
        check(pieces > 3, f"auto, seed {seed}: streamed in {pieces} pieces")
        kinds.add("calls" if want[1] else "reply")
        if want[1]:
            valid_calls(answer.tool_calls, PARAMS, f"auto, seed {seed}")
    check(kinds == {"calls", "reply"}, f"auto answered with {kinds}")
    # The calls and their results go back to the model: the conversation goes on.
    m = whole.choices[0].message
    history = ask + [
        {"role": "assistant", "content": None, "tool_calls": [t.model_dump() for t in m.tool_calls]},
        {"role": "tool", "tool_call_id": m.tool_calls[0].id, "content": "Sun, and a wind from the east"},
    ]
    r = c.chat.completions.create(model="x", messages=history, tools=TOOLS, max_tokens=80,
                                  tool_choice="required", parallel_tool_calls=False, temperature=0)
    valid_calls(r.choices[0].message.tool_calls, PARAMS, "after a tool result")
    # none: a plain answer; the older functions/function_call fields.
    r = call(tool_choice="none", temperature=0, extra_body={"max_tokens": 8})
    check(r.choices[0].message.tool_calls is None and r.choices[0].message.content, "tool_choice none")
    s, body, _ = srv.post("/v1/chat/completions", {
        "messages": ask, "max_tokens": 80, "temperature": 0,
        "functions": [t["function"] for t in TOOLS], "function_call": {"name": "get_weather"}})
    choice = json.loads(body)["choices"][0] if s == 200 else {}
    f = choice.get("message", {}).get("function_call") or {}
    check(f.get("name") == "get_weather" and choice["finish_reason"] == "function_call",
          f"functions: {s} {body[:300]}")
    jsonschema.validate(json.loads(f.get("arguments", "null")), PARAMS["get_weather"])
    # Mistakes are 400s naming the field.
    base = {"messages": ask, "max_tokens": 4, "tools": TOOLS}
    error_of(srv.post("/v1/chat/completions", {**base, "tool_choice": {
        "type": "function", "function": {"name": "smite"}}}), 400, "tool_choice")
    error_of(srv.post("/v1/chat/completions", {**base, "response_format": {"type": "json_object"}}),
             400, "response_format")
    error_of(srv.post("/v1/chat/completions", {**base, "chat_template_kwargs": [1]}), 400,
             "chat_template_kwargs")
    error_of(srv.post("/v1/chat/completions", {**base, "tools": [{"type": "function", "function": {
        "name": "x", "parameters": {"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}}}]}),
        400, "tools")


TEMPLATES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "golden-values",
                         "chat", "templates")
# A template, the tool-call format it teaches, and what its prompt shows of the tools.
NATIVE = [
    ("Qwen-Qwen3-0.6B.jinja", "Hermes <tool_call>", '<tools>\n{"type": "function"'),
    ("meta-llama-Llama-3.1-8B-Instruct.jinja", "Llama 3.x JSON", '"name": "get_weather"'),
    ("Mistral-Small-3.2-24B-Instruct-2506.jinja", "Mistral [TOOL_CALLS] [ARGS]",
     '[AVAILABLE_TOOLS][{"type": "function"'),
    ("openai-gpt-oss-120b.jinja", "Harmony (gpt-oss)", "namespace functions {"),
]


# Where each format's calls begin.
MARKERS = {"Hermes <tool_call>": "<tool_call>", "Llama 3.x JSON": "{",
           "Mistral [TOOL_CALLS] [ARGS]": "[TOOL_CALLS]", "Harmony (gpt-oss)": "to=functions."}


def native_tools():
    """Models whose template has a tool format get the tools through it and answer in it:
    required and named calls constrained to that format parse back into valid calls, streamed
    or not, and the calls and results go back through the template."""
    ask = [{"role": "user", "content": "What weather shall there be in Jerusalem?"}]
    for file, name, shown in NATIVE:
        srv = Server("--chat-template-file", os.path.join(TEMPLATES, file), "-np", "2",
                     "-c", "2048", "--api-key", KEY)
        try:
            c = srv.client()
            s, body = srv.get("/props")
            check(json.loads(body).get("tool_call_format") == name, f"{file}: /props {body[:300]}")
            s, body, _ = srv.post("/apply-template", {"messages": ask, "tools": TOOLS})
            check(s == 200 and shown in json.loads(body)["prompt"], f"{file}: prompt {body[:400]}")
            short = name.startswith("Mistral")
            # The request's template variables reach the template (Qwen3 reads this one).
            s, body, _ = srv.post("/apply-template", {
                "messages": ask, "chat_template_kwargs": {"enable_thinking": False}})
            if "Qwen3" in file:
                check(json.loads(body)["prompt"].endswith("<think>\n\n</think>\n\n"),
                      f"{file}: enable_thinking {body[-200:]}")
            call = lambda **kw: c.chat.completions.create(
                model="x", messages=ask, tools=TOOLS, max_tokens=100, parallel_tool_calls=False,
                **kw)
            whole = call(tool_choice="required", temperature=0.9, seed=5)
            m = whole.choices[0].message
            check(whole.choices[0].finish_reason == "tool_calls" and len(m.tool_calls or []) == 1,
                  f"{file}: one call: {whole.choices[0]}")
            valid_calls(m.tool_calls, PARAMS, f"{file}: required", short)
            named = {"type": "function", "function": {"name": "get_time"}}
            r = call(tool_choice=named, temperature=0.9, seed=6)
            valid_calls(r.choices[0].message.tool_calls, ["get_time"], f"{file}: named", short)
            streamed = {"name": "", "arguments": ""}
            for ch in call(tool_choice="required", temperature=0.9, seed=5, stream=True):
                for d in ch.choices[0].delta.tool_calls or []:
                    streamed["name"] += d.function.name or ""
                    streamed["arguments"] += d.function.arguments or ""
            want = {"name": m.tool_calls[0].function.name,
                    "arguments": m.tool_calls[0].function.arguments} if m.tool_calls else None
            check(streamed == want, f"{file}: streamed {streamed} vs {want}")
            # auto: text that begins no call (this model knows no tools), streamed as written.
            answer = call(tool_choice="auto", temperature=0.9, seed=7).choices[0].message
            got, _ = streamed_answer(call(tool_choice="auto", temperature=0.9, seed=7, stream=True))
            want = (answer.content or "",
                    [(t.function.name, t.function.arguments) for t in answer.tool_calls or []])
            check(got == want and not want[1] and MARKERS[name] not in want[0],
                  f"{file}: auto, streamed {got} vs {want}")
            if m.tool_calls:
                history = ask + [
                    {"role": "assistant", "content": None,
                     "tool_calls": [t.model_dump() for t in m.tool_calls]},
                    {"role": "tool", "tool_call_id": m.tool_calls[0].id, "content": "Sun"}]
                s, body, _ = srv.post("/apply-template", {"messages": history, "tools": TOOLS})
                check(s == 200 and m.tool_calls[0].function.name in json.loads(body)["prompt"]
                      and "Sun" in json.loads(body)["prompt"], f"{file}: history {body[:300]}")
                if "gpt-oss" in file:
                    # A call's analysis goes back to gpt-oss (its template reads `thinking`).
                    history[1]["reasoning_content"] = "Weather first."
                    s, body, _ = srv.post("/apply-template", {"messages": history, "tools": TOOLS})
                    check("<|channel|>analysis<|message|>Weather first.<|end|><|start|>assistant to="
                          in json.loads(body)["prompt"], f"{file}: thought {body[-400:]}")
                r = c.chat.completions.create(model="x", messages=history, tools=TOOLS,
                                              max_tokens=100, tool_choice="required",
                                              parallel_tool_calls=False, temperature=0)
                valid_calls(r.choices[0].message.tool_calls, PARAMS, f"{file}: after a result",
                            short)
        finally:
            srv.stop()


HARMONY = ["<|channel|>", "<|message|>", "<|start|>", "<|end|>", "<|return|>", "<|call|>",
           "<|constrain|>"]


def harmony():
    """gpt-oss's Harmony end to end, on the built-in model's file with seven byte tokens no
    UTF-8 text uses (0xF9-0xFF) renamed as Harmony's and gpt-oss's template: a required call
    is written in its channels and read back as the tool call (streamed the same, the header
    never in `content`). (A JSON schema's final channel is left to the grammar's unit test:
    this model, never trained on Harmony, opens an analysis message and does not close it.)"""
    d = tempfile.mkdtemp()
    model = os.path.join(d, "harmony.gguf")
    edited_gguf(KJV, model, tokens={0xF9 + 3 + i: t for i, t in enumerate(HARMONY)})
    srv = Server("-m", model, "--chat-template-file",
                 os.path.join(TEMPLATES, "openai-gpt-oss-120b.jinja"), "-c", "2048",
                 "--api-key", KEY)
    try:
        c = srv.client()
        s, body, _ = srv.post("/tokenize", {"content": "<|start|>assistant<|channel|>",
                                            "parse_special": True})
        check(json.loads(body)["tokens"][0] == 0xF9 + 3 + 2, f"harmony: tokens {body}")
        ask = [{"role": "user", "content": "What weather shall there be in Jerusalem?"}]
        call = lambda **kw: c.chat.completions.create(
            model="x", messages=ask, tools=TOOLS, max_tokens=100, parallel_tool_calls=False,
            tool_choice="required", temperature=0.9, **kw)
        for seed in (1, 3):
            whole = call(seed=seed)
            m = whole.choices[0].message
            check(whole.choices[0].finish_reason == "tool_calls" and len(m.tool_calls or []) == 1
                  and not m.content, f"harmony: one call, seed {seed}: {whole.choices[0]}")
            valid_calls(m.tool_calls, PARAMS, f"harmony: required, seed {seed}")
            got, content = {"name": "", "arguments": ""}, ""
            for ch in call(seed=seed, stream=True):
                content += ch.choices[0].delta.content or ""
                for d in ch.choices[0].delta.tool_calls or []:
                    got["name"] += d.function.name or ""
                    got["arguments"] += d.function.arguments or ""
            want = {"name": m.tool_calls[0].function.name,
                    "arguments": m.tool_calls[0].function.arguments} if m.tool_calls else None
            check(got == want and not content, f"harmony: streamed {got} {content!r} vs {want}")
    finally:
        srv.stop()


def messages(srv, c):
    """Anthropic's Messages API with the anthropic client: the same text as the chat endpoint
    for the same turns, streamed or not; stop sequences named; tool_use blocks valid against
    their input_schema, enforced by tool_choice, and tool results going back."""
    import anthropic
    a = anthropic.Anthropic(base_url=f"http://127.0.0.1:{srv.port}", api_key=KEY, max_retries=0)
    turns = [{"role": "user", "content": "In the beginning"}]
    # The client no longer sends sampling fields; the server reads them (Claude Code's older
    # versions send temperature).
    greedy = {"temperature": 0}
    kw = dict(model="x", max_tokens=12, system="Be brief.", messages=turns, extra_body=greedy)
    r = a.messages.create(**kw)
    text = r.content[0].text if r.content and r.content[0].type == "text" else None
    check(r.type == "message" and r.role == "assistant" and text, f"message {r}")
    check(r.stop_reason == "max_tokens" and r.usage.output_tokens == 12, f"usage {r}")
    same = c.chat.completions.create(model="x", max_tokens=12, temperature=0, messages=[
        {"role": "system", "content": "Be brief."}, *turns])
    check(same.choices[0].message.content == text, f"{text!r} vs chat's {same.choices[0]}")
    with a.messages.stream(**kw) as st:
        streamed = "".join(st.text_stream)
        final = st.get_final_message()
    check(streamed == text and final.stop_reason == "max_tokens", f"streamed {streamed!r} {final}")
    r = a.messages.create(**{**kw, "max_tokens": 60, "stop_sequences": [" ", "\n"]})
    check(r.stop_reason == "stop_sequence" and r.stop_sequence in (" ", "\n"), f"stop {r}")
    tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"]} for t in TOOLS]
    ask = [{"role": "user", "content": "What weather shall there be in Jerusalem?"}]
    tk = dict(model="x", max_tokens=100, messages=ask, tools=tools, extra_body=greedy,
              tool_choice={"type": "any", "disable_parallel_tool_use": True})
    r = a.messages.create(**tk)
    uses = [b for b in r.content if b.type == "tool_use"]
    check(r.stop_reason == "tool_use" and len(uses) == 1, f"tool_use {r}")
    for u in uses:
        jsonschema.validate(u.input, PARAMS[u.name])
    with a.messages.stream(**tk) as st:
        json_pieces = sum(e.type == "content_block_delta" and e.delta.type == "input_json_delta"
                          for e in st)
        final = st.get_final_message()
    check(json_pieces > 3, f"tool_use input streamed in {json_pieces} pieces")
    check([(b.name, b.input) for b in final.content if b.type == "tool_use"]
          == [(u.name, u.input) for u in uses], f"streamed tool_use {final} vs {r}")
    if uses:
        history = ask + [{"role": "assistant", "content": [b.model_dump() for b in r.content]},
                         {"role": "user", "content": [{"type": "tool_result",
                                                       "tool_use_id": uses[0].id,
                                                       "content": "Sun"}]}]
        r = a.messages.create(**{**tk, "messages": history,
                                 "tool_choice": {"type": "tool", "name": "get_time",
                                                 "disable_parallel_tool_use": True}})
        last = r.content[-1]
        check(last.type == "tool_use" and last.name == "get_time", f"after a result {r}")
    # Structured output: the text is JSON valid against the schema.
    schema = {"type": "object", "properties": {"book": {"enum": ["Ruth", "Job"]},
                                               "chapter": {"type": "integer", "minimum": 1,
                                                           "maximum": 9}},
              "required": ["book", "chapter"]}
    r = a.messages.create(**{**kw, "max_tokens": 60, "output_config": {
        "format": {"type": "json_schema", "schema": schema}}})
    try:
        jsonschema.validate(json.loads(r.content[0].text), schema)
    except (ValueError, jsonschema.ValidationError) as e:
        check(False, f"output_config.format: {r.content[0].text!r}: {e}")
    try:
        a.messages.create(model="x", messages=turns, max_tokens=0)
        check(False, "max_tokens 0 accepted")
    except anthropic.BadRequestError as e:
        check(e.body["error"]["type"] == "invalid_request_error", f"error {e.body}")


def embeddings(srv, c):
    """/v1/embeddings: one unit vector of the model's width per input, the same for the same
    text in any batch (and for its token ids), base64 equal to floats; a cosine of 1 with itself."""
    import base64
    import struct
    n_embd = json.loads(srv.get("/v1/models")[1])["data"][0]["meta"]["n_embd"]
    texts = ["In the beginning God created the heaven and the earth.", "Jesus wept.",
             "In the beginning God created the heaven and the earth."]
    # The openai client asks for base64 and decodes it.
    r = c.embeddings.create(model="x", input=texts)
    vs = [d.embedding for d in r.data]
    check([d.index for d in r.data] == [0, 1, 2] and all(len(v) == n_embd for v in vs),
          f"shape {[len(v) for v in vs]} vs {n_embd}")
    dot = lambda a, b: sum(x * y for x, y in zip(a, b))
    check(abs(dot(vs[0], vs[0]) - 1) < 1e-5, f"unit length {dot(vs[0], vs[0])}")
    check(vs[0] == vs[2] and dot(vs[0], vs[1]) < 0.9999, f"determinism, cosine {dot(vs[0], vs[1])}")
    s, body = srv.post("/v1/embeddings", {"input": texts[1], "encoding_format": "float"})[:2]
    floats = json.loads(body)["data"][0]["embedding"] if s == 200 else []
    check(floats == vs[1], "floats equal the decoded base64")
    tokens = json.loads(srv.post("/tokenize", {"content": texts[1], "add_special": True})[1])["tokens"]
    s, body = srv.post("/v1/embeddings", {"input": [tokens], "encoding_format": "base64"})[:2]
    raw = base64.b64decode(json.loads(body)["data"][0]["embedding"]) if s == 200 else b""
    check(list(struct.unpack(f"<{len(raw) // 4}f", raw)) == vs[1], "token ids give the text's vector")
    first = json.loads(srv.post("/tokenize", {"content": texts[0], "add_special": True})[1])["tokens"]
    check(r.usage.prompt_tokens == 2 * len(first) + len(tokens), f"usage {r.usage}")
    # llama-server's own /embedding: `content` gives its nested shape, `input` OpenAI's.
    s, body = srv.post("/embedding", {"content": texts[:2]})[:2]
    native = json.loads(body) if s == 200 else []
    check([(e.get("index"), e.get("embedding")) for e in native] == [(0, [vs[0]]), (1, [vs[1]])],
          f"/embedding with content: {s} {body[:200]}")
    s, body = srv.post("/embedding", {"input": texts[1]})[:2]
    check(s == 200 and json.loads(body)["data"][0]["embedding"] == vs[1], f"/embedding with input: {body[:200]}")
    error_of(srv.post("/embedding", {"content": "x", "embd_normalize": -1}), 400, "embd_normalize")
    error_of(srv.post("/v1/embeddings", {"input": []}), 400, "input")
    error_of(srv.post("/v1/embeddings", {"input": "x", "encoding_format": "hex"}), 400,
             "encoding_format")
    error_of(srv.post("/v1/embeddings", {"input": "x", "dimensions": 3}), 400, "dimensions")


def langchain(srv):
    # LangChain's structured output (JSON schema and function calling) and bound tools, from
    # Pydantic models that say nothing of other keys (their objects are read as closed).
    from typing import Literal
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel, Field

    class Verse(BaseModel):
        """A verse of the Bible."""
        book: Literal["Genesis", "Exodus", "Ruth"]
        chapter: int = Field(ge=1, le=50)
        verse: int = Field(ge=1, le=40)

    class GetWeather(BaseModel):
        """The weather in a city."""
        city: Literal["Jerusalem", "Babylon"]
        days: int = Field(ge=1, le=7)

    llm = ChatOpenAI(base_url=f"http://127.0.0.1:{srv.port}/v1", api_key=KEY, model="x",
                     temperature=0, max_tokens=100, max_retries=0)
    for method in ("json_schema", "function_calling"):
        v = llm.with_structured_output(Verse, method=method).invoke("Name a verse")
        check(isinstance(v, Verse), f"with_structured_output({method}): {v!r}")
    m = llm.bind_tools([GetWeather], tool_choice="required", parallel_tool_calls=False).invoke(
        "What weather in Jerusalem?")
    check(len(m.tool_calls) == 1 and m.tool_calls[0]["name"] == "GetWeather", f"bind_tools: {m!r}")
    if m.tool_calls:
        GetWeather(**m.tool_calls[0]["args"])


def reasoning(srv, c):
    # A thought forced by a grammar goes to reasoning_content, the rest to content; streamed
    # deltas reassemble to the same; reasoning_format none leaves it in content.
    gbnf = 'root ::= "<think>" [a-z ]{1,24} "</think>\\n" [A-Z] [a-z]{1,8} "."\n'
    kw = dict(max_tokens=60, temperature=0.9, seed=4,
              extra_body={"grammar": gbnf, "reasoning_format": "deepseek"})
    m = chat(c, "Think, then answer", **kw).choices[0].message
    thought = getattr(m, "reasoning_content", None)
    check(thought and re.fullmatch(r"[a-z ]{1,24}", thought) is not None, f"reasoning {thought!r}")
    check(re.fullmatch(r"[A-Z][a-z]{1,8}\.", m.content or "") is not None, f"content {m.content!r}")
    r_parts, c_parts = [], []
    for ch in chat(c, "Think, then answer", stream=True, **kw):
        d = ch.choices[0].delta if ch.choices else None
        r_parts.append(getattr(d, "reasoning_content", None) or "" if d else "")
        c_parts.append(d.content or "" if d else "")
    check(("".join(r_parts), "".join(c_parts)) == (thought, m.content),
          f"streamed thought {''.join(r_parts)!r} / {''.join(c_parts)!r}")
    plain = chat(c, "Think, then answer", **{**kw, "extra_body": {"grammar": gbnf,
                                                                  "reasoning_format": "none"}})
    check(plain.choices[0].message.content == f"<think>{thought}</think>\n{m.content}",
          f"reasoning_format none: {plain.choices[0].message.content!r}")
    error_of(srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                               "reasoning_format": "loud"}), 400, "reasoning_format")


def responses(srv, c):
    # /v1/responses is a chat request: the same text, as a response object or named events.
    kw = dict(model="x", input="Who is the LORD?", instructions="Answer briefly",
              max_output_tokens=12, temperature=0)
    r = c.responses.create(**kw)
    want = c.chat.completions.create(model="x", max_tokens=12, temperature=0, messages=[
        {"role": "system", "content": "Answer briefly"},
        {"role": "user", "content": "Who is the LORD?"}]).choices[0].message.content
    check(r.output_text == want and r.status == "incomplete", f"response {r.status} {r.output_text!r} vs {want!r}")
    check(r.usage.output_tokens == 12 and r.id.startswith("resp_"), f"response usage {r.usage}")
    events = list(c.responses.create(**kw, stream=True))
    kinds = [e.type for e in events]
    check(kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                        "response.content_part.added"] and kinds[-1] == "response.incomplete",
          f"event order {kinds}")
    check([e.sequence_number for e in events] == list(range(len(events))), "sequence numbers")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    check(text == want and events[-1].response.output_text == want, f"streamed response {text!r}")
    # Function tools (flat, as the Responses API writes them) and a JSON-schema text format.
    tool = {"type": "function", "name": "get_weather", "parameters": PARAMS["get_weather"]}
    r = c.responses.create(model="x", input=[{"role": "user", "content": "Weather?"}], tools=[tool],
                           tool_choice="required", parallel_tool_calls=False, temperature=0.9,
                           max_output_tokens=80, extra_body={"seed": 2})
    calls = [o for o in r.output if o.type == "function_call"]
    check(len(calls) == 1 and calls[0].name == "get_weather", f"response tools {r.output}")
    for call in calls:
        jsonschema.validate(json.loads(call.arguments), PARAMS["get_weather"])
    # Streamed, the call's arguments arrive in pieces after its item, and equal the whole.
    events = list(c.responses.create(model="x", input=[{"role": "user", "content": "Weather?"}],
                                     tools=[tool], tool_choice="required",
                                     parallel_tool_calls=False, temperature=0.9,
                                     max_output_tokens=80, extra_body={"seed": 2}, stream=True))
    kinds = [e.type for e in events]
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    added = kinds.index("response.output_item.added") if "response.output_item.added" in kinds else -1
    check(len(deltas) > 3 and 0 <= added < kinds.index("response.function_call_arguments.delta")
          and calls and "".join(deltas) == calls[0].arguments
          and [o.arguments for o in events[-1].response.output] == [calls[0].arguments],
          f"streamed function call: {kinds} {deltas}")
    r = c.responses.create(model="x", input="Yea or nay?", max_output_tokens=80, temperature=0.9,
                           extra_body={"seed": 3}, text={"format": {
                               "type": "json_schema", "name": "a", "schema": SCHEMAS[2], "strict": True}})
    jsonschema.validate(json.loads(r.output_text), SCHEMAS[2])
    error_of(srv.post("/v1/responses", {"input": "x", "previous_response_id": "resp_1"}), 400,
             "previous_response_id")
    error_of(srv.post("/v1/responses", {"instructions": "x"}), 400, "input")


def slow_client(srv):
    # A client sending its headers one byte at a time is dropped; others are served meanwhile.
    s = socket.create_connection(("127.0.0.1", srv.port))
    start = time.time()
    dropped = False
    served = False
    for ch in b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 40:
        try:
            s.send(bytes([ch]))
        except OSError:
            dropped = True
            break
        if not served:
            served = srv.get("/health")[0] == 200
        time.sleep(0.25)
        s.settimeout(0.01)
        try:
            if s.recv(1024) == b"":
                dropped = True
                break
        except socket.timeout:
            pass
        except OSError:
            dropped = True
            break
    s.close()
    check(dropped and time.time() - start < 8, f"slow client dropped after {time.time() - start:.1f} s")
    check(served, "others served meanwhile")
    # A body that stops arriving is answered 408 once --timeout (2 s) has passed.
    s = socket.create_connection(("127.0.0.1", srv.port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode()
              + b"\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\":")
    s.settimeout(10)
    start = time.time()
    answer = b""
    try:
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            chunk = s.recv(4096)
            if not chunk:
                break
            answer += chunk
    except OSError:
        pass
    s.close()
    check(answer.startswith(b"HTTP/1.1 408") and b'"error"' in answer and time.time() - start < 6,
          f"stalled body: {answer[:120]!r} after {time.time() - start:.1f} s")
    # A body that trickles in, a byte every 0.5 s, is answered 408 once the whole of --timeout
    # (2 s) has passed: the bound is on the body, not on each piece of it.
    s = socket.create_connection(("127.0.0.1", srv.port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode()
              + b"\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n")
    start = time.time()
    answer = b""
    s.settimeout(0.5)
    while time.time() - start < 10 and not answer:
        try:
            s.send(b" ")
            answer = s.recv(4096)
        except socket.timeout:
            pass
        except OSError:
            break
    s.close()
    check(answer.startswith(b"HTTP/1.1 408") and time.time() - start < 5,
          f"trickled body: {answer[:120]!r} after {time.time() - start:.1f} s")


def load(srv, c):
    # 64 clients x 4 requests of mixed lengths: no error, every answer as the same request alone.
    prompts = ["And God said", "In the beginning God created", "Hear, O Israel: The LORD our God"]
    reqs = [(prompts[i % 3], 4 + i % 13, i) for i in range(64)]
    expect = {}
    for p, n, seed in reqs[:13 * 3]:
        expect[(p, n, seed % 5)] = None

    def one(r):
        p, n, seed = r
        out = c.completions.create(model="x", prompt=p, max_tokens=n, temperature=0.7, seed=seed % 5)
        return (p, n, seed % 5), out.choices[0].text, out.usage.completion_tokens

    for r in reqs:
        key, text, _ = one(r)
        expect[key] = text
    rss0 = srv.rss_kib()
    errors_seen = []

    def client(i):
        got = []
        for k in range(4):
            try:
                got.append(one(reqs[(i + k) % 64]))
            except Exception as e:  # noqa: BLE001 - any error fails the check below
                errors_seen.append(repr(e))
        return got

    with ThreadPoolExecutor(64) as ex:
        results = [r for rs in ex.map(client, range(64)) for r in rs]
    check(not errors_seen, f"load errors: {errors_seen[:3]}")
    check(len(results) == 256, f"{len(results)} answers of 256")
    check(all(expect[k] == t for k, t, _ in results), "answers under load equal them alone")
    check(all(n == k[1] for k, _, n in results), "token counts")
    check(srv.metric_becomes("hesper_sequences_running", 0), "nothing runs after the load")
    rss1 = srv.rss_kib()
    check(rss1 - rss0 < 16 * 1024, f"memory after the load {rss1} KiB, before {rss0} KiB")


def on_the_gpu(srv):
    # The GPU backend batches sequences too: four concurrent clients get what each gets alone.
    c = srv.client()
    args = [("In the beginning", 1), ("And God said", 2), ("Hear, O Israel", 3), ("The LORD is", 4)]
    run = lambda a: streamed_chat(c, a[0], max_tokens=12, temperature=0.9, seed=a[1])[0]
    alone = [run(a) for a in args]
    with ThreadPoolExecutor(4) as ex:
        together = list(ex.map(run, args))
    check(alone == together, f"GPU: concurrent {together} vs alone {alone}")
    check(any("gpu" in line for line in srv.log), "the GPU server runs on the GPU")


def hot_swap():
    """`serve --hot-swap`: the model file edited under the server (one tensor's type, made with
    `hesper-rs quantize`) is swapped in on GET /health, after which every token's log-probability
    equals a fresh server's on the new file; POST /reload finds nothing more; a torn file is
    refused with a 409 while the weights stay; /metrics counts it all."""
    d = tempfile.mkdtemp()
    base, changed, live = (os.path.join(d, n) for n in ("base.gguf", "changed.gguf", "live.gguf"))
    kjv = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models",
                       "hesper-kjv.gguf")
    for args in ([kjv, base, "Q8_0"],
                 [base, changed, "Q8_0", "--tensor-type", "blk.0.ffn_up.weight=F16"]):
        subprocess.run([BIN, "quantize", *args], check=True, capture_output=True)
    shutil.copy(base, live)
    body = {"prompt": "And God said", "max_tokens": 16, "temperature": 0, "logprobs": 1}

    def answer(srv):
        status, text, _ = srv.post("/v1/completions", body)
        check(status == 200, f"hot-swap completion: {status} {text[:200]}")
        lp = json.loads(text)["choices"][0]["logprobs"]
        return lp["tokens"], lp["token_logprobs"]

    fresh = Server("-m", changed, "--api-key", KEY)
    try:
        want = answer(fresh)
    finally:
        fresh.stop()
    srv = Server("-m", live, "--hot-swap", "--metrics", "--api-key", KEY)
    try:
        status, text, _ = srv.request("POST", "/reload")
        check(status == 401, f"/reload asks for the key: {status}")
        before = answer(srv)
        check(before != want, "the edited tensor changes the log-probabilities")
        shutil.copy(changed, live + ".next")
        os.replace(live + ".next", live)
        status, text = srv.get("/health")
        swapped = json.loads(text).get("hot_swap", {}).get("swapped")
        check(status == 200 and swapped == [
            {"name": "blk.0.ffn_up.weight", "from": "Q8_0", "to": "F16"}], f"health swaps: {text}")
        check(answer(srv) == want, "after the swap, log-probabilities equal a fresh load's")
        status, text, _ = srv.post("/reload", None)
        check(status == 200 and json.loads(text)["swapped"] == [], f"nothing more: {text}")
        with open(base, "rb") as f:
            half = f.read()[: os.path.getsize(base) // 2]
        with open(live, "wb") as f:
            f.write(half)
        e = error_of(srv.post("/reload", None), 409)
        check("the weights loaded before stay" in e.get("message", ""), f"409 says why: {e}")
        status, text = srv.get("/health")
        check(status == 200 and "error" in json.loads(text)["hot_swap"], f"health: {text}")
        check(answer(srv) == want, "a torn file keeps the weights")
        # The start-up wait for /health ran the first check.
        for name, value in (("hesper_hot_swap_checks_total", 5), ("hesper_hot_swaps_total", 1),
                            ("hesper_hot_swap_tensors_total", 1),
                            ("hesper_hot_swap_refused_total", 2)):
            check(srv.metric(name) == value, f"{name} = {srv.metric(name)} (want {value})")
        # Keyless clients polling /health share its checks, which start at least a second after
        # the last ended: 12 clients calling 3 times each over T seconds start at most T + 1
        # checks (one per call without the limit), and at least 3 (each call is answered by a
        # check that started after it arrived).
        before, answers = srv.metric("hesper_hot_swap_checks_total"), []

        def poll():
            for _ in range(3):
                answers.append(srv.request("GET", "/health")[:2])
        start = time.time()
        clients = [threading.Thread(target=poll) for _ in range(12)]
        for c in clients:
            c.start()
        for c in clients:
            c.join()
        elapsed, ran = time.time() - start, srv.metric("hesper_hot_swap_checks_total") - before
        check(len(answers) == 36 and all(s == 200 and "error" in json.loads(t)["hot_swap"]
                                         for s, t in answers), f"polled /health: {answers[:2]}")
        check(3 <= ran <= elapsed + 1, f"{ran:.0f} checks for 36 calls in {elapsed:.2f} s")
    finally:
        srv.stop()
        shutil.rmtree(d, ignore_errors=True)
    plain = Server("--api-key", KEY)
    try:
        error_of(plain.post("/reload", None), 404)
    finally:
        plain.stop()


def cors():
    """`--cors-origin '*'` answers a browser's preflight from any origin; an origin that
    cannot be used ends the server at start with one line."""
    srv = Server("--cors-origin", "*", "--api-key", KEY)
    try:
        s, _, r = srv.request("OPTIONS", "/v1/chat/completions", headers={
            "Origin": "https://app.example", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type"})
        check(s == 200 and r.getheader("Access-Control-Allow-Origin") == "*",
              f"preflight with '*': {s} {r.getheader('Access-Control-Allow-Origin')!r}")
        s, _, r = srv.request("GET", "/health", headers={"Origin": "https://other.example"})
        check(s == 200 and r.getheader("Access-Control-Allow-Origin") == "*", "a GET with '*'")
    finally:
        srv.stop()
    for bad in (["not an origin"], ["*", "https://app.example"]):
        args = [a for o in bad for a in ("--cors-origin", o)]
        p = subprocess.run([BIN, "serve", "--port", "0", *args], capture_output=True, text=True,
                           timeout=30)
        lines = p.stderr.strip().splitlines()
        check(p.returncode != 0 and len(lines) == 1 and "--cors-origin" in lines[0],
              f"--cors-origin {bad}: exit {p.returncode}, {p.stderr!r}")


def hostile_template():
    """A chat template that loops for ever or grows a string without end answers 400 naming
    its limit, while /health goes on answering within a second."""
    path = os.path.join(tempfile.mkdtemp(), "hostile.jinja")
    with open(path, "w") as f:
        f.write("{% set m = messages[0].content %}"
                "{% if m == 'loop' %}{% for i in range(100000) %}{% for j in range(100000) %}"
                "{% endfor %}{% endfor %}"
                "{% elif m == 'grow' %}{% set ns = namespace(s='xy') %}"
                "{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}"
                "{% else %}{{ m }}{% endif %}")
    srv = Server("--chat-template-file", path, "--api-key", KEY)
    try:
        def hostile(kind):
            return srv.post("/v1/chat/completions", {
                "messages": [{"role": "user", "content": kind}], "max_tokens": 2})
        with ThreadPoolExecutor(8) as pool:
            answers = [pool.submit(hostile, k) for k in ["loop", "grow"] * 4]
            while not all(a.done() for a in answers):
                t = time.time()
                s, _ = srv.get("/health")
                check(s == 200 and time.time() - t < 1,
                      f"/health during hostile renders: {s} after {time.time() - t:.2f} s")
            for a in answers:
                e = error_of(a.result(), 400, "messages")
                check("ran out of its limit" in e.get("message", ""), f"hostile: {e}")
        s, text, _ = hostile("fine")
        check(s == 200, f"a plain message after hostile ones: {s} {text[:200]}")
    finally:
        srv.stop()


def full_queue_and_disconnect(srv):
    auth = {"Authorization": f"Bearer {KEY}"}
    long = {"prompt": "And", "max_tokens": 4000, "stream": True, "temperature": 1.0}
    # A streaming client reads two chunks and goes away: its sequence is freed.
    conn = http.client.HTTPConnection("127.0.0.1", srv.port)
    conn.request("POST", "/v1/completions", json.dumps(long), {**auth, "Content-Type": "application/json"})
    resp = conn.getresponse()
    resp.fp.readline()
    resp.fp.readline()
    check(srv.metric("hesper_sequences_running") == 1, "one sequence runs")
    # /slots shows it in slot 0, and a probe for an idle slot is refused.
    s, body = srv.get("/slots")
    slots = json.loads(body) if s == 200 else []
    busy = slots[0] if slots else {}
    check(len(slots) == 1 and busy.get("is_processing") is True and "And" in busy.get("prompt", "")
          and busy.get("next_token", [{}])[0].get("n_decoded", 0) >= 2
          and busy.get("params", {}).get("temperature") == 1.0
          and busy.get("n_kv_positions", 0) >= 4000, f"/slots while busy: {s} {body[:400]}")
    error_of(srv.get("/slots?fail_on_no_slot=1"), 503)
    # With it running and one request waiting, the next is refused with 503 and Retry-After.
    waiting = threading.Thread(target=lambda: srv.post("/v1/completions", {"prompt": "And", "max_tokens": 2}))
    waiting.start()
    srv.metric_becomes("hesper_requests_queued", 1)
    s, text, r = srv.post("/v1/completions", {"prompt": "And", "max_tokens": 2})
    error_of((s, text), 503)
    check(r.getheader("Retry-After") == "1", "Retry-After")
    conn.close()
    waiting.join(30)
    check(not waiting.is_alive(), "the waiting request was served once the first client left")
    check(srv.metric_becomes("hesper_sequences_running", 0), "a disconnect frees its sequence")
    check(srv.metric("hesper_tokens_generated_total") < 4000, "the abandoned sequence stopped early")
    # A client that leaves when nothing else is queued: the gauge goes back to 0 all the same.
    conn = http.client.HTTPConnection("127.0.0.1", srv.port)
    conn.request("POST", "/v1/completions", json.dumps(long), {**auth, "Content-Type": "application/json"})
    resp = conn.getresponse()
    resp.fp.readline()
    check(srv.metric_becomes("hesper_sequences_running", 1), "the lone stream runs")
    conn.close()
    check(srv.metric_becomes("hesper_sequences_running", 0), "a lone disconnect frees its sequence")
    # More answers than --queue 1 can ever hold: a 400 naming the flag, not 503 forever.
    e = error_of(srv.post("/v1/completions", {"prompt": "And", "max_tokens": 2, "n": 2})[:2], 400, "n")
    check("--queue 1" in e.get("message", ""), f"names --queue: {e}")
    e = error_of(srv.post("/v1/completions", {"prompt": ["And", "It"], "max_tokens": 2})[:2], 400, "prompt")


KJV = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models", "hesper-kjv.gguf")


def edited_gguf(src, dst, keys=None, tokens=None):
    """Copies the GGUF file `src` to `dst` with the u32 metadata `keys` ({name: value}) added
    and the tokens `tokens` ({id: text}) renamed as control tokens (the tensors' data moved to
    the next aligned offset, their offsets unchanged)."""
    import struct
    keys, tokens = keys or {}, tokens or {}
    data = open(src, "rb").read()
    at = 24
    n_tensors, n_kv = struct.unpack_from("<QQ", data, 8)
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    align = 32
    pack_str = lambda s: struct.pack("<Q", len(s.encode())) + s.encode()

    def string(at):
        n, = struct.unpack_from("<Q", data, at)
        return data[at + 8:at + 8 + n].decode(), at + 8 + n

    def value(t, at):
        if t == 8:
            return string(at)[1]
        if t == 9:
            et, n = struct.unpack_from("<IQ", data, at)
            at += 12
            for _ in range(n):
                at = value(et, at)
            return at
        return at + sizes[t]

    kvs = b""
    for _ in range(n_kv):
        start = at
        key, at = string(at)
        t, = struct.unpack_from("<I", data, at)
        if key == "general.alignment":
            align, = struct.unpack_from("<I", data, at + 4)
        end = value(t, at + 4)
        if key == "tokenizer.ggml.tokens" and tokens:
            n, = struct.unpack_from("<Q", data, at + 8)
            texts, p = [], at + 16
            for _ in range(n):
                text, p = string(p)
                texts.append(text)
            for i, text in tokens.items():
                texts[i] = text
            kvs += pack_str(key) + struct.pack("<IIQ", 9, 8, n) + b"".join(map(pack_str, texts))
        elif key == "tokenizer.ggml.token_type" and tokens:
            entry = bytearray(data[start:end])
            for i in tokens:
                struct.pack_into("<i", entry, at - start + 16 + 4 * i, 3)
            kvs += bytes(entry)
        else:
            kvs += data[start:end]
        at = end
    kv_end = at
    for _ in range(n_tensors):
        _, at = string(at)
        n_dims, = struct.unpack_from("<I", data, at)
        at += 4 + 8 * n_dims + 4 + 8
    tensor_start = (at + align - 1) // align * align
    added = b"".join(pack_str(k) + struct.pack("<II", 4, v) for k, v in keys.items())
    head = (data[:16] + struct.pack("<Q", n_kv + len(keys)) + kvs + added
            + data[kv_end:at])
    head += b"\0" * (-len(head) % align)
    with open(dst, "wb") as f:
        f.write(head + data[tensor_start:])


def infill():
    """POST /infill: a model without fill-in-the-middle tokens is a 400 naming them; with them
    (the built-in model's file with three of its tokens named FIM prefix, suffix and middle),
    the prompt is llama-server's layout — the other files after snippet separators, BOS, PRE,
    the prefix's last 3/4 of a batch, the prompt, SUF, the suffix's start, MID — and the
    answer is /completion's for those ids."""
    srv = Server("--api-key", KEY)
    try:
        e = error_of(srv.post("/infill", {"input_prefix": "a", "input_suffix": "b"})[:2], 400)
        check("prefix, suffix and middle tokens" in e.get("message", ""), f"infill refused: {e}")
    finally:
        srv.stop()
    d = tempfile.mkdtemp()
    model = os.path.join(d, "fim.gguf")
    pre, suf, mid = 5, 6, 7
    edited_gguf(KJV, model, keys={"tokenizer.ggml.fim_pre_token_id": pre,
                                  "tokenizer.ggml.fim_suf_token_id": suf,
                                  "tokenizer.ggml.fim_mid_token_id": mid})
    srv = Server("-m", model, "--api-key", KEY, "-b", "64", "-c", "256")
    try:
        tok = lambda text: json.loads(srv.post("/tokenize", {"content": text, "parse_special": False})[1])["tokens"]
        bos = json.loads(srv.post("/tokenize", {"content": "", "add_special": True})[1])["tokens"]
        prefix = "And God said, Let there be light: and there was light. " * 4
        suffix = " and the evening and the morning were the first day. " * 3
        req = {"input_prefix": prefix, "input_suffix": suffix, "prompt": "And God",
               "input_extra": [{"filename": "a.txt", "text": "In the beginning"}],
               "n_predict": 6, "temperature": 0}
        s, body, _ = srv.post("/infill", req)
        got = json.loads(body) if s == 200 else {}
        # Batch 64: the prefix keeps its last 48 tokens, the suffix 16 - 2 - |prompt|.
        p, x, q = tok(prefix), tok(suffix), tok("And God")
        extra = tok("\n\n--- snippet ---\n\n") + tok("In the beginning")
        want = extra + bos + [pre] + p[-48:] + q + [suf] + x[:16 - 2 - len(q)] + [mid]
        check(len(p) > 48 and len(x) > 16, f"the texts outgrow the batch: {len(p)} {len(x)}")
        check(got.get("tokens_evaluated") == len(want), f"/infill: {s} {body[:300]} want {len(want)}")
        s2, body2, _ = srv.post("/completion", {"prompt": want, "n_predict": 6, "temperature": 0})
        plain = json.loads(body2) if s2 == 200 else {}
        check(got.get("prompt") == plain.get("prompt") and got.get("content") == plain.get("content")
              and got.get("tokens_predicted") == 6, f"/infill {body[:300]} vs /completion {body2[:300]}")
        error_of(srv.post("/infill", {"input_suffix": "b"})[:2], 400, "input_prefix")
        error_of(srv.post("/infill", {"input_prefix": "a", "input_suffix": "b",
                                      "input_extra": [{"filename": "x"}]})[:2], 400, "input_extra")
    finally:
        srv.stop()
        shutil.rmtree(d, ignore_errors=True)


def switches():
    """The chat page at / and /slots are on by default (the page without a key) and off with
    --no-webui and --no-slots; /props shows the KV pool."""
    srv = Server("--api-key", KEY, "-np", "3")
    try:
        s, body, r = srv.request("GET", "/")
        check(s == 200 and "<title>hesper-rs</title>" in body
              and r.getheader("Content-Type").startswith("text/html"), f"/: {s} {body[:200]}")
        s, body, _ = srv.request("GET", "/webui/app.js")
        check(s == 200 and "v1/chat/completions" in body, f"/webui/app.js: {s}")
        error_of(srv.request("GET", "/v1/models")[:2], 401)
        s, body = srv.get("/slots")
        check(s == 200 and [(x["id"], x["is_processing"]) for x in json.loads(body)]
              == [(0, False), (1, False), (2, False)], f"/slots idle: {body[:300]}")
        check(srv.get("/slots?fail_on_no_slot=1")[0] == 200, "an idle slot is found")
        pool = json.loads(srv.get("/props")[1]).get("kv_pool", {})
        check(pool.get("capacity") == 3 * 256 and 0 < pool.get("held", 0) <= pool["capacity"],
              f"/props kv_pool {pool}")
    finally:
        srv.stop()
    srv = Server("--api-key", KEY, "--no-webui", "--no-slots")
    try:
        error_of(srv.get("/"), 404)
        error_of(srv.get("/slots"), 501)
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
