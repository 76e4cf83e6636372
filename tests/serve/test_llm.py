#!/usr/bin/env python3
"""Language models behind `slim serve`, end to end over the OpenAI API: the server on a
generated GGUF (tests/serve/make_llm.py: random weights, a real byte-level tokenizer, a
ChatML template) on free loopback ports, called with curl (-N for the event streams) and
with raw sockets where a client must vanish mid-stream.

Greedy outputs are the oracle: a request gives the same tokens alone, streamed, batched
with 15 others, preempted by an urgent request and resumed, or served from the prefix
cache. Run by ctest with SLIM_BINARY_DIR set to the build folder.
"""
import concurrent.futures
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from serve_harness import Server  # noqa: E402

TMP = tempfile.mkdtemp(prefix="slim_llm_test_")
subprocess.run(["/usr/bin/python3", os.path.join(HERE, "make_llm.py"), TMP], check=True)
subprocess.run(["/usr/bin/python3", os.path.join(HERE, "make_llm.py"), TMP, "--long"], check=True)
MODEL = os.path.join(TMP, "chat.gguf")
LONG_MODEL = os.path.join(TMP, "chat-long.gguf")  # context 4096: requests that last seconds


def start(*extra, model=MODEL):
    return Server(["--model", model, "--host", "127.0.0.1", "--http-port", "0", "--allow-grpc", "false",
                   "--metrics-port", "0", "--threads", "2"] + list(extra))


def curl(url, body=None, headers=(), stream=False):
    """(status, headers, body text) of one request made with curl."""
    with tempfile.TemporaryDirectory() as tmp:
        out, head = os.path.join(tmp, "out"), os.path.join(tmp, "head")
        args = ["curl", "-sS", "--max-time", "120", "-o", out, "-D", head, "-w", "%{http_code}"]
        if stream:
            args.append("-N")
        if body is not None:
            data = body if isinstance(body, (bytes, str)) else json.dumps(body)
            with open(os.path.join(tmp, "body"), "w" if isinstance(data, str) else "wb") as f:
                f.write(data)
            args += ["--data-binary", "@" + os.path.join(tmp, "body"), "-H", "Content-Type: application/json"]
        for h in headers:
            args += ["-H", h]
        p = subprocess.run(args + [url], capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError("curl %s failed: %s" % (url, p.stderr))
        with open(head, encoding="latin-1", newline="") as f:
            lines = f.read().split("\r\n")
        hdrs = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if value:
                hdrs[name.strip().lower()] = value.strip()
        with open(out, encoding="utf-8", errors="replace") as f:
            return int(p.stdout), hdrs, f.read()


def post(srv, path, body, headers=()):
    status, hdrs, text = curl(srv.url(path), body, headers)
    return status, hdrs, json.loads(text)


def sse_events(text):
    """The data payloads of an event stream, in order ('[DONE]' kept as a string)."""
    events = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), block
        payload = block[len("data: "):]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def metric(srv, name, labels=""):
    _, _, text = curl("http://127.0.0.1:%d/metrics" % srv.metrics_port)
    total = None
    for line in text.splitlines():
        if line.startswith(name + "{") and labels in line or line.startswith(name + " "):
            total = (total or 0) + float(line.rsplit(" ", 1)[1])
    return total


def completion(srv, prompt, n_tokens, model="chat", **extra):
    body = {"model": model, "prompt": prompt, "max_tokens": n_tokens, "temperature": 0}
    body.update(extra)
    status, _, r = post(srv, "/v1/completions", body)
    assert status == 200, r
    return r


PROMPTS = ["The server said hello", "Once upon a time in a land", "SELECT * FROM users WHERE",
           "def main():\n    return", "Zebras and lions", "1 2 3 4 5 6", "the the the", "Quantization"]


class Api(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.srv = start("--max-sequences", "4")

    @classmethod
    def tearDownClass(cls):
        assert cls.srv.stop() == 0

    def test_models_and_health(self):
        status, _, r = curl(self.srv.url("/v1/models"))
        self.assertEqual(status, 200)
        models = json.loads(r)
        self.assertEqual(models["object"], "list")
        self.assertEqual([m["id"] for m in models["data"]], ["chat"])
        self.assertEqual(models["data"][0]["context_length"], 512)
        status, _, r = curl(self.srv.url("/health"))
        self.assertEqual((status, json.loads(r)), (200, {"status": "ok"}))
        status, _, r = curl(self.srv.url("/v1/models/nope"))
        self.assertEqual(status, 404)

    def test_chat_completion_shape_and_usage(self):
        body = {"model": "chat", "max_tokens": 12, "temperature": 0,
                "messages": [{"role": "system", "content": "You are terse."},
                             {"role": "user", "content": [{"type": "text", "text": "Hi "},
                                                          {"type": "text", "text": "there"}]}]}
        status, _, r = post(self.srv, "/v1/chat/completions", body)
        self.assertEqual(status, 200, r)
        self.assertEqual(r["object"], "chat.completion")
        self.assertTrue(r["id"].startswith("chatcmpl-"))
        self.assertEqual(r["model"], "chat")
        (choice,) = r["choices"]
        self.assertEqual(choice["message"]["role"], "assistant")
        self.assertIn(choice["finish_reason"], ("stop", "length"))
        u = r["usage"]
        self.assertEqual(u["total_tokens"], u["prompt_tokens"] + u["completion_tokens"])
        self.assertLessEqual(u["completion_tokens"], 12)
        if choice["finish_reason"] == "length":
            self.assertEqual(u["completion_tokens"], 12)
        # The array-of-parts content renders as the concatenated string does.
        body["messages"][1]["content"] = "Hi there"
        status, _, r2 = post(self.srv, "/v1/chat/completions", body)
        self.assertEqual(r2["choices"][0]["message"]["content"], choice["message"]["content"])
        self.assertEqual(r2["usage"]["prompt_tokens"], u["prompt_tokens"])

    def test_prompt_as_token_ids(self):
        r = completion(self.srv, [5, 6, 7, 8, 9], 6)
        self.assertEqual(r["usage"]["prompt_tokens"], 5)
        self.assertEqual(r["object"], "text_completion")

    def test_stream_equals_non_stream(self):
        for chat in (False, True):
            path = "/v1/chat/completions" if chat else "/v1/completions"
            body = {"model": "chat", "max_tokens": 20, "temperature": 0}
            if chat:
                body["messages"] = [{"role": "user", "content": "Tell me about KV caches"}]
            else:
                body["prompt"] = "Tell me about KV caches"
            status, _, plain = post(self.srv, path, body)
            self.assertEqual(status, 200)
            body.update(stream=True, stream_options={"include_usage": True})
            status, hdrs, text = curl(self.srv.url(path), body, stream=True)
            self.assertEqual(status, 200)
            self.assertTrue(hdrs["content-type"].startswith("text/event-stream"))
            events = sse_events(text)
            self.assertEqual(events[-1], "[DONE]")
            usage = events[-2]
            self.assertEqual(usage["choices"], [])
            self.assertEqual(usage["usage"]["completion_tokens"], plain["usage"]["completion_tokens"])
            self.assertEqual(usage["usage"]["prompt_tokens"], plain["usage"]["prompt_tokens"])
            chunks = events[:-2]
            if chat:
                self.assertEqual(chunks[0]["choices"][0]["delta"].get("role"), "assistant")
                self.assertEqual(chunks[0]["object"], "chat.completion.chunk")
                streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
                want = plain["choices"][0]["message"]["content"]
                self.assertEqual(chunks[-1]["choices"][0]["delta"], {})
            else:
                streamed = "".join(c["choices"][0]["text"] for c in chunks)
                want = plain["choices"][0]["text"]
            self.assertEqual(streamed, want)
            self.assertEqual(chunks[-1]["choices"][0]["finish_reason"], plain["choices"][0]["finish_reason"])
            self.assertTrue(all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1]))

    def test_stop_strings_across_token_boundaries(self):
        r = completion(self.srv, "Stop right there", 40, logprobs=0)
        text = r["choices"][0]["text"]
        tokens = r["choices"][0]["logprobs"]["tokens"]
        self.assertEqual("".join(tokens), text)
        # Two adjacent one-character ASCII tokens: a stop string that spans their boundary.
        pick = next((i for i in range(len(tokens) - 1)
                     if all(len(t) == 1 and t.isascii() and t.isprintable() for t in tokens[i:i + 2])), None)
        self.assertIsNotNone(pick, tokens)
        stop = tokens[pick] + tokens[pick + 1]
        cut = text.index(stop)
        for stream in (False, True):
            body = {"model": "chat", "prompt": "Stop right there", "max_tokens": 40, "temperature": 0,
                    "stop": ["never-appears", stop], "stream": stream}
            if stream:
                _, _, t = curl(self.srv.url("/v1/completions"), body, stream=True)
                chunks = sse_events(t)[:-1]
                got = "".join(c["choices"][0]["text"] for c in chunks)
                finish = chunks[-1]["choices"][0]["finish_reason"]
            else:
                _, _, s = post(self.srv, "/v1/completions", body)
                got, finish = s["choices"][0]["text"], s["choices"][0]["finish_reason"]
            self.assertEqual(got, text[:cut], "stream" if stream else "plain")
            self.assertEqual(finish, "stop")

    def test_logprobs(self):
        body = {"model": "chat", "max_tokens": 8, "temperature": 0, "logprobs": True, "top_logprobs": 3,
                "messages": [{"role": "user", "content": "Numbers"}]}
        _, _, r = post(self.srv, "/v1/chat/completions", body)
        content = r["choices"][0]["logprobs"]["content"]
        self.assertEqual(len(content), r["usage"]["completion_tokens"] - (r["choices"][0]["finish_reason"] == "stop"))
        for entry in content:
            self.assertEqual(len(entry["top_logprobs"]), 3)
            # Greedy: the chosen token is the most likely one.
            self.assertEqual(entry["top_logprobs"][0]["token"], entry["token"])
            self.assertAlmostEqual(entry["top_logprobs"][0]["logprob"], entry["logprob"])
            self.assertLessEqual(entry["logprob"], 0)
            self.assertEqual(bytes(entry["bytes"]).decode("utf-8", "replace"), entry["token"])

    def test_seeded_sampling_and_n(self):
        body = {"model": "chat", "prompt": "Random walk", "max_tokens": 16, "temperature": 1.0, "seed": 42, "n": 3}
        _, _, a = post(self.srv, "/v1/completions", body)
        _, _, b = post(self.srv, "/v1/completions", body)
        self.assertEqual([c["index"] for c in a["choices"]], [0, 1, 2])
        self.assertEqual([c["text"] for c in a["choices"]], [c["text"] for c in b["choices"]])
        self.assertGreater(len({c["text"] for c in a["choices"]}), 1)  # choices draw with seeds 42, 43, 44
        lengths = sum(c["finish_reason"] == "length" for c in a["choices"])
        self.assertGreaterEqual(a["usage"]["completion_tokens"], 16 * lengths)
        self.assertLessEqual(a["usage"]["completion_tokens"], 48)

    def test_penalties_change_greedy_output(self):
        plain = completion(self.srv, "the the the the", 24)["choices"][0]["text"]
        again = completion(self.srv, "the the the the", 24)["choices"][0]["text"]
        self.assertEqual(plain, again)
        pen = completion(self.srv, "the the the the", 24, frequency_penalty=2.0, presence_penalty=2.0)
        self.assertNotEqual(pen["choices"][0]["text"], plain)

    def test_batched_equals_alone(self):
        alone = [completion(self.srv, p, 24)["choices"][0]["text"] for p in PROMPTS[:4]]
        jobs = [PROMPTS[i % 4] for i in range(16)]
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            together = list(pool.map(lambda p: completion(self.srv, p, 24)["choices"][0]["text"], jobs))
        self.assertEqual(together, [alone[i % 4] for i in range(16)])

    def test_follow_up_turn_reuses_the_prefix(self):
        history = [{"role": "system", "content": "You answer questions about databases. " * 8},
                   {"role": "user", "content": "What is an index?"}]
        body = {"model": "chat", "max_tokens": 10, "temperature": 0, "messages": history}
        _, _, first = post(self.srv, "/v1/chat/completions", body)
        history = history + [first["choices"][0]["message"],
                             {"role": "user", "content": "And a B-tree?"}]
        body["messages"] = history
        _, _, second = post(self.srv, "/v1/chat/completions", body)
        cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        # Everything up to the first answer's last token is found in the cache.
        self.assertGreaterEqual(cached, first["usage"]["prompt_tokens"])
        self.assertLess(cached, second["usage"]["prompt_tokens"])

    def test_errors(self):
        cases = [
            ("/v1/chat/completions", b"{not json", 400, "not valid JSON"),
            ("/v1/chat/completions", {"model": "chat"}, 400, "'messages' is required"),
            ("/v1/chat/completions", {"model": "nope", "messages": [{"role": "user", "content": "x"}]}, 404,
             "does not exist"),
            ("/v1/chat/completions", {"model": "chat", "messages": [{"role": "wizard", "content": "x"}]}, 400,
             "'messages[0].role' is 'wizard'"),
            ("/v1/chat/completions", {"model": "chat", "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "x"}}]}]}, 400, "text parts only"),
            ("/v1/completions", {"model": "chat", "prompt": "x", "temperature": 5}, 400,
             "'temperature' must be a number from 0 to 2"),
            ("/v1/completions", {"model": "chat", "prompt": "x", "max_tokens": 100000}, 400,
             "maximum context length is 512 tokens"),
            ("/v1/completions", {"model": "chat", "prompt": "x", "n": 0}, 400, "'n' must be an integer"),
            ("/v1/completions", {"model": "chat", "prompt": [1, 2, 99999]}, 400, "outside the vocabulary"),
            ("/v1/completions", {"model": "chat", "prompt": "x", "stop": [""]}, 400, "must not be empty"),
            ("/v1/completions", {"model": "chat", "prompt": ""}, 400, "the prompt is empty"),
            ("/v1/completions", {"model": "chat", "prompt": "x", "top_logprobs": 2, "logprobs": 50}, 400,
             "'logprobs' must be an integer from 0 to 20"),
        ]
        for path, body, status, message in cases:
            got, _, r = post(self.srv, path, body)
            self.assertEqual(got, status, (body, r))
            self.assertIn(message, r["error"]["message"], body)
            self.assertEqual(r["error"]["type"], "not_found_error" if status == 404 else "invalid_request_error")
        got, _, r = post(self.srv, "/v1/completions", {"model": "chat", "prompt": "x", "max_tokens": 2},
                         headers=["X-Priority: urgent"])
        self.assertEqual(got, 400)
        self.assertIn("X-Priority", r["error"]["message"])
        # Unknown fields are ignored, as OpenAI clients send many.
        got, _, r = post(self.srv, "/v1/completions", {"model": "chat", "prompt": "x", "max_tokens": 2,
                                                        "user": "u1", "logit_bias": {}, "parallel_tool_calls": True})
        self.assertEqual(got, 200, r)
        # A language model is not a KServe v2 model.
        got, _, r = post(self.srv, "/v2/models/chat/infer", {"inputs": []})
        self.assertEqual(got, 400)
        self.assertIn("is a language model", r["error"])

    def test_metrics(self):
        completion(self.srv, "metrics please", 4)
        _, _, text = curl("http://127.0.0.1:%d/metrics" % self.srv.metrics_port)
        for family in ("slim_llm_prompt_tokens_total", "slim_llm_generated_tokens_total",
                       "slim_llm_time_to_first_token_seconds_bucket", "slim_llm_inter_token_latency_seconds_bucket",
                       "slim_llm_request_duration_seconds_bucket", "slim_llm_sequences_running",
                       "slim_llm_sequences_waiting", "slim_llm_kv_blocks_used", "slim_llm_kv_blocks_free",
                       "slim_llm_prefix_cache_hit_ratio", "slim_llm_preemptions_total"):
            self.assertIn(family, text)
        self.assertGreaterEqual(metric(self.srv, "slim_llm_generated_tokens_total"), 4)
        promtool = os.environ.get("SLIM_PROMTOOL")
        if promtool and os.path.exists(promtool):
            p = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)


def open_stream(port, body):
    """A raw HTTP request whose response is read by the caller (and maybe abandoned)."""
    data = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
    return s


class Scheduling(unittest.TestCase):
    def test_urgent_request_preempts_and_the_victim_output_is_unchanged(self):
        with start("--max-sequences", "1", model=LONG_MODEL) as srv:
            long_prompt = "A long background job about the history of relational databases"
            alone = completion(srv, long_prompt, 4000, model="chat-long")["choices"][0]["text"]
            urgent_alone = completion(srv, "Urgent!", 8, model="chat-long")["choices"][0]["text"]
            # The background request (4000 tokens, about a second) streams; the urgent one
            # arrives once it has started.
            conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=120)
            conn.request("POST", "/v1/completions", json.dumps(
                {"model": "chat-long", "prompt": long_prompt, "max_tokens": 4000, "temperature": 0, "priority": 10,
                 "stream": True, "stream_options": {"include_usage": True}}), {"Content-Type": "application/json"})
            resp = conn.getresponse()
            first = resp.readline()
            self.assertTrue(first.startswith(b"data: "), first)
            urgent = completion(srv, "Urgent!", 8, model="chat-long", priority=0)
            rest = first + resp.read()
            conn.close()
            events = sse_events(rest.decode())
            self.assertEqual(events[-1], "[DONE]")
            streamed = "".join(e["choices"][0]["text"] for e in events[:-2])
            self.assertEqual(urgent["choices"][0]["text"], urgent_alone)
            self.assertEqual(urgent["slim"]["preemptions"], 0)
            self.assertEqual(streamed, alone)
            self.assertEqual(events[-2]["slim"]["preemptions"], 1)
            self.assertEqual(metric(srv, "slim_llm_preemptions_total"), 1)

    def test_full_queue_answers_429_with_retry_after(self):
        with start("--max-sequences", "1", "--max-llm-queue", "1", model=LONG_MODEL) as srv:
            # The second request must arrive while the first still streams: 4000 tokens take
            # seconds (400 had taken 0.2 s, about what starting curl takes on a busy machine);
            # should it still end first, that case is tried again.
            for _ in range(5):
                s = open_stream(srv.http_port, {"model": "chat-long", "prompt": "hold the line", "max_tokens": 4000,
                                                "temperature": 0, "stream": True, "priority": 3})
                s.recv(1)  # the stream has started
                status, hdrs, text = curl(srv.url("/v1/completions"),
                                          {"model": "chat-long", "prompt": "me too", "max_tokens": 4, "priority": 3})
                if status == 429:
                    break
                self.assertEqual(status, 200, text)
                s.close()
            self.assertEqual(status, 429, text)
            self.assertEqual(hdrs.get("retry-after"), "1")
            self.assertIn("in flight", json.loads(text)["error"]["message"])
            # Another priority level has a queue of its own.
            status, _, _ = curl(srv.url("/v1/completions"),
                                {"model": "chat-long", "prompt": "me too", "max_tokens": 4, "priority": 0})
            self.assertEqual(status, 200)
            s.close()

    def test_disconnect_cancels_and_a_storm_leaves_the_pool_empty(self):
        with start("--max-sequences", "4", "--cache-sequences", "0") as srv:
            # One client vanishes mid-stream of a 400-token request: its sequence stops. (A
            # loaded machine may let all 400 tokens out before the close: then again.)
            for attempt in range(1, 6):
                s = open_stream(srv.http_port, {"model": "chat", "prompt": "stream forever", "max_tokens": 400,
                                                "temperature": 0, "stream": True})
                s.recv(200)
                s.close()
                deadline = time.monotonic() + 20
                while (metric(srv, "slim_llm_sequences_running") or 0) > 0 and time.monotonic() < deadline:
                    time.sleep(0.02)
                self.assertEqual(metric(srv, "slim_llm_sequences_running"), 0)
                if metric(srv, "slim_llm_generated_tokens_total") < 400 * attempt:
                    break
            self.assertLess(metric(srv, "slim_llm_generated_tokens_total"), 400 * attempt)

            # A storm: abandoned streams, abandoned plain requests, malformed bodies.
            def one(i):
                kind = i % 4
                if kind == 0:
                    c = open_stream(srv.http_port, {"model": "chat", "prompt": PROMPTS[i % 8], "max_tokens": 300,
                                                    "stream": True, "temperature": 0.7, "seed": i})
                    c.recv(64)
                    c.close()
                elif kind == 1:
                    c = open_stream(srv.http_port, {"model": "chat", "prompt": PROMPTS[i % 8], "max_tokens": 50})
                    c.close()
                elif kind == 2:
                    status, _, _ = curl(srv.url("/v1/completions"), b'{"model": "chat", "prompt": ')
                    assert status == 400
                else:
                    status, _, _ = curl(srv.url("/v1/chat/completions"),
                                        {"model": "chat", "messages": [{"role": "user", "content": "hi"}],
                                         "max_tokens": 5, "temperature": 0})
                    assert status == 200

            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                list(pool.map(one, range(40)))
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and (
                    metric(srv, "slim_llm_sequences_running") or metric(srv, "slim_llm_sequences_waiting")):
                time.sleep(0.05)
            self.assertEqual(metric(srv, "slim_llm_sequences_running"), 0)
            self.assertEqual(metric(srv, "slim_llm_sequences_waiting"), 0)
            self.assertEqual(metric(srv, "slim_llm_kv_blocks_used"), 0)
            # And it still answers.
            self.assertEqual(completion(srv, PROMPTS[0], 3)["usage"]["completion_tokens"], 3)
            self.assertEqual(srv.stop(), 0)


class RepositoryModels(unittest.TestCase):
    def test_gguf_in_a_repository_with_options_from_its_config(self):
        repo = tempfile.mkdtemp(prefix="slim_llm_repo_")
        for name, params in (("small", {"max_sequences": "2", "kv_type": "q8", "cache_sequences": "0"}),
                             ("broken", {"kv_type": "q3"}), ("odd", {"temperature": "0.5"})):
            os.makedirs(os.path.join(repo, name, "1"))
            os.link(MODEL, os.path.join(repo, name, "1", "model.gguf"))
            with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
                for k, v in params.items():
                    f.write('parameters { key: "%s" value: { string_value: "%s" } }\n' % (k, v))
        with Server(["--model-repository", repo, "--host", "127.0.0.1", "--http-port", "0",
                     "--allow-grpc", "false", "--metrics-port", "0"]) as srv:
            _, _, models = curl(srv.url("/v1/models"))
            self.assertEqual([m["id"] for m in json.loads(models)["data"]], ["small"])
            status, _, index = curl(srv.url("/v2/repository/index"), {})
            reasons = {m["name"]: m.get("reason", "") for m in json.loads(index)}
            self.assertIn("config.pbtxt: parameter 'kv_type': unknown KV type", reasons["broken"])
            self.assertIn("parameter 'temperature' is not a language-model option", reasons["odd"])
            r = completion(srv, "from the repository", 6, model="small")
            self.assertEqual(r["model"], "small")
            self.assertEqual(r["usage"]["completion_tokens"], 6)
            # q8 keys and values: one byte per element and a scale per token and head.
            self.assertLess(metric(srv, "slim_llm_kv_block_bytes"), 16 * 32 * 2 * 2)
            self.assertEqual(srv.stop(), 0)


if __name__ == "__main__":
    unittest.main()
