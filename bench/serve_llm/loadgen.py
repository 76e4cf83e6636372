#!/usr/bin/python3
"""A load generator for OpenAI-style chat servers (slim serve, llama-server): N concurrent
clients hold multi-turn conversations over POST /v1/chat/completions with streaming, and
every request's time to first token, inter-token gaps and end-to-end time are measured.

Workload (seeded, the same for every server): all conversations share one system prompt of
about 300 tokens; user turns are pieces of real text (shared/models/heldout-long.txt, PostgreSQL
manual pages) whose lengths in tokens are log-normal (first turn median 150, follow-ups median
60); max_tokens is log-normal (median 128, 16-512); a conversation continues with probability
0.6 per turn while it fits the per-client context, and each follow-up sends the whole history
back, assistant replies included. Lengths are in tokens: a calibration request measures the
model's characters per token on the same text first.

Runs are bounded by a number of requests (shared by the clients) and a wall-clock cap; at the
cap, streams still open are closed and counted as cut. The mixed run adds requests with
priority 0 (others 10), one per nine normal requests completed (10% of all); each has a twin
(the same length and max_tokens, other text) to replay on the idle server.

Stdlib only (http.client and threads), for /usr/bin/python3.
Usage: loadgen.py --port PORT [--clients 8] [--requests 64] [--duration 300] [--mixed] [--ctx 2048]
"""
import argparse
import http.client
import json
import math
import os
import random
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import llamacpp  # noqa: E402  (bench/llamacpp.py: find_shared)

SYSTEM_TOKENS = 300
HIGH, NORMAL = 0, 10
SYSTEM_HEAD = ("You are a helpful assistant for PostgreSQL administrators. Answer the user's questions "
               "using the reference below; quote it where it helps.\n\nReference:\n")


def percentile(xs, q):
    """The q-th percentile (0-100) of xs, linearly interpolated between order statistics."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = (len(s) - 1) * q / 100.0
    lo = math.floor(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def lognormal_int(rng, median, sigma, lo, hi):
    return int(min(hi, max(lo, round(rng.lognormvariate(math.log(median), sigma)))))


class Corpus:
    """Real text to cut prompts from: the held-out documents, one string each."""

    def __init__(self, path):
        with open(path, encoding="utf-8") as f:
            self.docs = [d.strip() for d in f.read().split("<|endoftext|>") if len(d.strip()) > 2000]

    def piece(self, rng, chars):
        """About `chars` characters from a random document, starting and ending at whitespace."""
        doc = rng.choice(self.docs)
        chars = min(chars, len(doc) - 1)
        start = rng.randrange(0, len(doc) - chars)
        start = doc.find(" ", start) + 1 if start else 0
        end = doc.find(" ", start + chars)
        return doc[start:end if end > 0 else len(doc)].strip()


def stream_chat(host, port, body, priority=None, deadline=None, timeout=600):
    """One streaming chat request. Returns a record: status, ttft, gaps (between content
    chunks), e2e (seconds), prompt/output tokens (from usage), text, error, cut."""
    rec = dict(start=time.perf_counter(), status=0, ttft=None, gaps=[], e2e=None, prompt_tokens=None, output_tokens=None, cached_tokens=None,
               text="", error=None, cut=False, priority=priority)
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if priority is not None:
        headers["X-Priority"] = str(priority)
    payload = json.dumps(body).encode()
    parts = []
    t0 = time.perf_counter()
    last = None
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("POST", "/v1/chat/completions", payload, headers)
        resp = conn.getresponse()
        rec["status"] = resp.status
        if resp.status != 200:
            rec["error"] = resp.read().decode(errors="replace")[:500]
            return rec
        while True:
            line = resp.readline()
            now = time.perf_counter()
            if not line:
                rec["error"] = rec["error"] or "stream ended without [DONE]"
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue  # blank separators, comments, event: lines
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                rec["error"] = json.dumps(chunk["error"])[:500]
                break
            for choice in chunk.get("choices") or []:
                content = (choice.get("delta") or {}).get("content")
                if content:
                    if last is None:
                        rec["ttft"] = now - t0
                    else:
                        rec["gaps"].append(now - last)
                    last = now
                    parts.append(content)
            usage = chunk.get("usage")
            if usage:
                rec["prompt_tokens"] = usage.get("prompt_tokens")
                rec["output_tokens"] = usage.get("completion_tokens")
                rec["cached_tokens"] = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
            if deadline is not None and now > deadline:
                rec["cut"] = True
                break
        rec["e2e"] = time.perf_counter() - t0
    except (OSError, http.client.HTTPException, ValueError) as e:
        rec["error"] = "%s: %s" % (type(e).__name__, e)
    finally:
        conn.close()
        rec["text"] = "".join(parts)
    return rec


class Workload:
    """The seeded request mix: system prompt, user turns and max_tokens, sized in tokens."""

    def __init__(self, corpus, chars_per_token, seed=1):
        self.corpus = corpus
        self.cpt = chars_per_token
        self.seed = seed
        self.system = SYSTEM_HEAD + corpus.piece(random.Random(seed), int(SYSTEM_TOKENS * chars_per_token))

    def user_text(self, rng, first, chars=None):
        """A user turn: a first turn's or a follow-up's length, or about `chars` characters."""
        if chars is None:
            tokens = lognormal_int(rng, 150, 0.8, 16, 800) if first else lognormal_int(rng, 60, 0.8, 8, 400)
            chars = int(tokens * self.cpt)
        return self.corpus.piece(rng, chars) + "\n\nSummarize the above."

    @staticmethod
    def max_tokens(rng):
        return lognormal_int(rng, 128, 0.6, 16, 512)


def calibrate(host, port, model, corpus):
    """Characters per token of the corpus text under the server's tokenizer: one request with
    a known text and max_tokens 1 (its usage says how many prompt tokens it was)."""
    text = corpus.piece(random.Random(0), 1200)  # under 2,048 tokens even at one byte per token
    rec = stream_chat(host, port, dict(model=model, messages=[dict(role="user", content=text)], max_tokens=1,
                                       stream=True, stream_options=dict(include_usage=True), temperature=0))
    if rec["error"] or not rec["prompt_tokens"]:
        raise RuntimeError("calibration request failed: %s" % (rec["error"] or "no usage in the stream"))
    return len(text) / rec["prompt_tokens"]


def list_model(host, port):
    """The first model id of GET /v1/models."""
    conn = http.client.HTTPConnection(host, port, timeout=30)
    try:
        conn.request("GET", "/v1/models")
        resp = conn.getresponse()
        return json.loads(resp.read())["data"][0]["id"]
    finally:
        conn.close()


def summarize(recs, wall):
    """Per-run numbers: output tokens/s over the run's wall time, TTFT, ITL and e2e percentiles."""
    ok = [r for r in recs if not r["error"] and not r["cut"]]
    ttft = [r["ttft"] for r in recs if r["ttft"] is not None and not r["error"]]
    gaps = [g for r in recs if not r["error"] for g in r["gaps"]]
    # Cut streams count the content chunks they received (one token each on both servers).
    out = sum(r["output_tokens"] or 0 for r in ok) + sum(len(r["gaps"]) + 1 for r in recs if r["cut"] and r["ttft"])
    ms = 1000.0
    return dict(requests=len(recs), ok=len(ok), errors=sum(1 for r in recs if r["error"]),
                cut=sum(1 for r in recs if r["cut"]), wall_s=wall, output_tokens=out,
                output_tps=out / wall if wall > 0 else float("nan"),
                prompt_tokens_mean=sum(r["prompt_tokens"] or 0 for r in ok) / max(1, len(ok)),
                output_tokens_mean=sum(r["output_tokens"] or 0 for r in ok) / max(1, len(ok)),
                ttft_p50_ms=percentile(ttft, 50) * ms, ttft_p99_ms=percentile(ttft, 99) * ms,
                itl_p50_ms=percentile(gaps, 50) * ms, itl_p99_ms=percentile(gaps, 99) * ms,
                e2e_p50_ms=percentile([r["e2e"] for r in ok], 50) * ms,
                first_errors=[r["error"] for r in recs if r["error"]][:3])


def strip(rec):
    """A record for the JSON output: no gaps or text (they are summarized)."""
    return {k: v for k, v in rec.items() if k not in ("gaps", "text")}


def run_load(host, port, model, workload, clients, requests, duration, ctx, mixed=False, temperature=0.0):
    """`clients` closed-loop clients share `requests` tickets; each holds conversations until the
    tickets or the wall-clock cap run out. mixed: normal requests carry priority 10 and an open-loop
    stream of priority-0 single-turn requests adds one per nine normal ones. Returns
    (summary, records, the high-priority requests' twins for an idle replay)."""
    lock = threading.Lock()
    tickets = [requests]
    recs, hi_recs, hi_bodies = [], [], []
    start = time.perf_counter()
    deadline = start + duration
    done = threading.Event()

    def body(rng, messages, max_tokens):
        b = dict(model=model, messages=messages, max_tokens=max_tokens, stream=True,
                 stream_options=dict(include_usage=True), temperature=temperature)
        if temperature > 0:
            b["seed"] = rng.randrange(1 << 31)
        return b

    def client(i):
        rng = random.Random(workload.seed * 1000 + i)
        history, used = None, 0  # used: the tokens the conversation holds (prompt + reply) so far
        while time.perf_counter() < deadline:
            with lock:
                if tickets[0] <= 0:
                    return
                tickets[0] -= 1
            first = history is None
            user = workload.user_text(rng, first)
            max_tokens = workload.max_tokens(rng)
            need = len(user) / workload.cpt + max_tokens + 16
            if not first and used + need > ctx * 0.9:
                first, history = True, None
                user = workload.user_text(rng, True)
                need = len(user) / workload.cpt + max_tokens + 16
            if first:
                history = [dict(role="system", content=workload.system)]
                used = len(workload.system) / workload.cpt
                max_tokens = max(16, min(max_tokens, int(ctx * 0.9 - used - len(user) / workload.cpt - 16)))
            messages = history + [dict(role="user", content=user)]
            b = body(rng, messages, max_tokens)
            if mixed:
                b["priority"] = NORMAL
            rec = stream_chat(host, port, b, NORMAL if mixed else None, deadline)
            rec.update(client=i, turn=(len(messages) - 1) // 2, max_tokens=max_tokens)
            with lock:
                recs.append(rec)
            if rec["error"] or rec["cut"] or rng.random() > 0.6:
                history = None  # a failed turn, or the user leaves: the next one starts afresh
            else:
                history = messages + [dict(role="assistant", content=rec["text"])]
                used = (rec["prompt_tokens"] or used + need) + max(rec["output_tokens"] or 0,
                                                                    len(rec["text"]) / workload.cpt)

    def high_priority():
        """Priority-0 single-turn requests, one per nine completed normal ones, each sent after a
        random delay (uniform up to the mean gap between normal completions) so that it does
        not arrive in step with a completion, until the normal clients are done."""
        rng = random.Random(workload.seed * 1000 + 999)
        threads = []
        while not done.wait(0.02):
            with lock:
                n_done = len(recs)
            if n_done < 9 * (len(hi_bodies) + 1):
                continue
            if done.wait(rng.uniform(0, (time.perf_counter() - start) / n_done)):
                break
            user = workload.user_text(rng, True)
            # Its twin for the idle replay: the same length, other text, so that the replay
            # finds only the system prompt in a prefix cache, as the request itself did.
            twin = workload.user_text(rng, True, len(user))
            max_tokens = workload.max_tokens(rng)
            b = body(rng, [dict(role="system", content=workload.system), dict(role="user", content=user)], max_tokens)
            b["priority"] = HIGH
            hi_bodies.append(dict(b, messages=[b["messages"][0], dict(role="user", content=twin)]))

            def send(b=b):
                rec = stream_chat(host, port, b, HIGH, deadline)
                with lock:
                    hi_recs.append(rec)
            t = threading.Thread(target=send)
            t.start()
            threads.append(t)
        for t in threads:
            t.join()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    hi = threading.Thread(target=high_priority) if mixed else None
    if hi:
        hi.start()
    for t in threads:
        t.join()
    done.set()
    if hi:
        hi.join()
    wall = time.perf_counter() - start
    for r in recs + hi_recs:
        r["start"] -= start
    summary = summarize(recs + hi_recs, wall)
    summary.update(clients=clients)
    if mixed:
        summary["normal"] = summarize(recs, wall)
        summary["high"] = summarize(hi_recs, wall)
    return summary, [strip(r) for r in recs + hi_recs], hi_bodies


def replay(host, port, bodies):
    """The given requests one at a time on an otherwise idle server: their records."""
    return [stream_chat(host, port, b, b.get("priority")) for b in bodies]


def followup_probe(host, port, model, workload, repeats=3, history_tokens=1000):
    """TTFT of a follow-up turn whose conversation so far holds ~history_tokens tokens (the
    server has just answered the turn before), against a cold request of the same length
    (other text, no system prompt: nothing in common with what the server has seen)."""
    rng = random.Random(workload.seed * 1000 + 777)
    rows = []
    for _ in range(repeats):
        opts = dict(stream=True, stream_options=dict(include_usage=True), temperature=0)
        first = workload.corpus.piece(rng, int((history_tokens - SYSTEM_TOKENS - 64) * workload.cpt))
        messages = [dict(role="system", content=workload.system), dict(role="user", content=first)]
        turn1 = stream_chat(host, port, dict(model=model, messages=messages, max_tokens=64, **opts))
        follow = workload.corpus.piece(rng, int(40 * workload.cpt))
        messages += [dict(role="assistant", content=turn1["text"]), dict(role="user", content=follow)]
        warm = stream_chat(host, port, dict(model=model, messages=messages, max_tokens=8, **opts))
        chars = sum(len(m["content"]) for m in messages)
        cold_text = "Cold %d. " % rng.randrange(1 << 30) + workload.corpus.piece(rng, chars)
        cold = stream_chat(host, port, dict(model=model, messages=[dict(role="user", content=cold_text)],
                                             max_tokens=8, **opts))
        for r in (turn1, warm, cold):
            if r["error"]:
                raise RuntimeError("follow-up probe request failed: %s" % r["error"])
        rows.append(dict(history_tokens=turn1["prompt_tokens"] + turn1["output_tokens"],
                         warm_prompt_tokens=warm["prompt_tokens"], warm_ttft_ms=warm["ttft"] * 1000,
                         warm_cached_tokens=warm["cached_tokens"],
                         cold_prompt_tokens=cold["prompt_tokens"], cold_ttft_ms=cold["ttft"] * 1000))
    warm = percentile([r["warm_ttft_ms"] for r in rows], 50)
    cold = percentile([r["cold_ttft_ms"] for r in rows], 50)
    return dict(rows=rows, warm_ttft_ms=warm, cold_ttft_ms=cold, ratio=warm / cold)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=64, help="requests in all (shared by the clients)")
    ap.add_argument("--duration", type=float, default=300, help="wall-clock cap, seconds")
    ap.add_argument("--ctx", type=int, default=2048, help="context tokens per client (per server slot)")
    ap.add_argument("--mixed", action="store_true", help="add ~10%% priority-0 requests; replay them idle after")
    ap.add_argument("--followup", action="store_true", help="also the follow-up vs cold TTFT probe")
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy; else seeded sampling")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--corpus", default=llamacpp.find_shared("heldout-long.txt"), help="text to cut prompts from")
    ap.add_argument("--json", help="write the summary and records here")
    a = ap.parse_args()
    sys.setswitchinterval(0.0005)  # timestamps: a thread woken by its socket gets the GIL sooner
    corpus = Corpus(a.corpus)
    model = list_model(a.host, a.port)
    workload = Workload(corpus, calibrate(a.host, a.port, model, corpus), a.seed)
    out = dict(model=model, chars_per_token=workload.cpt)
    out["summary"], out["records"], bodies = run_load(a.host, a.port, model, workload, a.clients, a.requests,
                                                      a.duration, a.ctx, a.mixed, a.temperature)
    if a.mixed:
        idle = replay(a.host, a.port, bodies)
        out["idle_high"] = summarize(idle, sum(r["e2e"] or 0 for r in idle))
    if a.followup:
        out["followup"] = followup_probe(a.host, a.port, model, workload)
    print(json.dumps({k: v for k, v in out.items() if k != "records"}, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
