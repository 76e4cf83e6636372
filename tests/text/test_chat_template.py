"""slim's chat-template renderer against Python's jinja2.

Every template in tests/text/chat_templates/ (the chat templates of real model families,
as their tokenizer_config.json carries them) and slim's built-in ChatML is rendered for a
set of conversations by `slim chat-template` and by jinja2 in Hugging Face transformers'
environment (ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks, loopcontrols,
raise_exception, strftime_now and its json.dumps tojson). The outputs must be equal byte
for byte; where jinja2 raises through raise_exception, slim must fail with the same
message, and where jinja2 fails otherwise, slim must fail too.

Run by ctest with SLIM_BINARY_DIR set to the build folder (SLIM_TEST_RUNNER, an emulator
command line, goes in front of slim when set).
"""
import datetime
import json
import os
import shlex
import struct
import subprocess
import tempfile
import unittest

import jinja2
import jinja2.ext
from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATES = os.path.join(HERE, "chat_templates")
NOW = 1722000000  # the clock strftime_now() reads on both sides (26 Jul 2024)
BOS, EOS = "<s>", "</s>"

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


def system(text):
    return {"role": "system", "content": text}


CONVERSATIONS = {
    "system_user": [system("You are a helpful assistant."), user("Hello!")],
    "user_only": [user("What is 2+2?")],
    "multi_turn": [user("Hi"), assistant("Hello! How can I help?"), user("Tell me a joke.")],
    "system_multi_turn": [system("Answer briefly."), user("Capital of France?"), assistant("Paris."),
                          user("And of Italy?"), assistant("Rome."), user("Thanks")],
    "unicode_and_spaces": [
        system("  Réponds en français.\n"),
        user("  héllo wörld 👋\n\nline two\t "),
        assistant(" 日本語のテキスト \n"),
        user("quotes ' \" \\ and {{ not a tag }} {% raw %} <s> [INST]\r\nend"),
    ],
    "empty_content": [user(""), assistant(""), user(" ")],
    "long": [m for k in range(12) for m in (user(f"question {k}"), assistant(f"answer {k}"))] + [user("last")],
    "ends_with_assistant": [user("Write a haiku."), assistant("Leaves fall")],
    "tool_result": [user("Weather in Paris?"), assistant("Checking."), {"role": "tool", "content": '{"temp": 21}'},
                    user("Thanks")],
    # Role errors: the Llama 2, Mistral and Gemma templates raise_exception on these.
    "two_users": [user("one"), user("two")],
    "assistant_first": [assistant("I start."), user("ok")],
    "system_only": [system("Just a system prompt.")],
    "empty": [],
}


def template_files():
    return sorted(f for f in os.listdir(TEMPLATES) if f.endswith(".jinja"))


def hf_environment():
    """jinja2 as transformers' chat-template renderer configures it."""
    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.fromtimestamp(NOW).strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def slim_command(*args):
    build = os.environ.get("SLIM_BINARY_DIR")
    if not build:
        raise RuntimeError("SLIM_BINARY_DIR is not set (ctest sets it to the build folder)")
    return shlex.split(os.environ.get("SLIM_TEST_RUNNER", "")) + [os.path.join(build, "tools", "slim")] + list(args)


def jinja_render(env, source, messages, add_generation_prompt):
    """('ok', text), ('raise', message) for raise_exception, or ('error', description)."""
    try:
        text = env.from_string(source).render(messages=messages, bos_token=BOS, eos_token=EOS,
                                              add_generation_prompt=add_generation_prompt)
        return "ok", text
    except TemplateError as e:
        if type(e) is TemplateError:  # raise_exception's, not a subclass (undefined, syntax)
            return "raise", str(e)
        return "error", f"{type(e).__name__}: {e}"
    except Exception as e:  # TypeError and the like from Python operations
        return "error", f"{type(e).__name__}: {e}"


def write_json(tmp, name, obj):
    path = os.path.join(tmp, name)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False)
    return path


def slim_render(source_args, messages_path, add_generation_prompt, extra=()):
    args = ["chat-template", *source_args, "--messages", messages_path, "--bos", BOS, "--eos", EOS,
            "--now", str(NOW), *extra]
    if not add_generation_prompt:
        args.append("--no-generation-prompt")
    return subprocess.run(slim_command(*args), capture_output=True, timeout=60)


def gguf_string(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def write_gguf(path, metadata):
    """A GGUF v3 file with metadata only: {key: str | int | [str]}."""
    body = b""
    for key, value in metadata.items():
        body += gguf_string(key)
        if isinstance(value, str):
            body += struct.pack("<I", 8) + gguf_string(value)
        elif isinstance(value, int):
            body += struct.pack("<I", 4) + struct.pack("<I", value)
        else:
            body += struct.pack("<IIQ", 9, 8, len(value)) + b"".join(gguf_string(v) for v in value)
    with open(path, "wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, 0, len(metadata)) + body)


class ChatTemplateMatchesJinja2(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.env = hf_environment()
        cls.tmp = tempfile.TemporaryDirectory()
        cls.message_files = {name: write_json(cls.tmp.name, name + ".json", msgs)
                             for name, msgs in CONVERSATIONS.items()}

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def check(self, label, source, source_args, outcomes):
        """Renders every conversation both ways; counts the outcomes."""
        for conv, messages in CONVERSATIONS.items():
            for agp in (True, False):
                with self.subTest(template=label, conversation=conv, add_generation_prompt=agp):
                    kind, want = jinja_render(self.env, source, messages, agp)
                    got = slim_render(source_args, self.message_files[conv], agp)
                    stderr = got.stderr.decode("utf-8", "replace")
                    outcomes[kind] += 1
                    if kind == "ok":
                        self.assertEqual(got.returncode, 0, stderr)
                        self.assertEqual(got.stdout.decode("utf-8"), want)
                        self.assertEqual(got.stdout, want.encode("utf-8"))
                    elif kind == "raise":
                        self.assertEqual(got.returncode, 2, stderr)
                        self.assertEqual(stderr, f"slim: error [invalid_argument]: {want}\n")
                    else:
                        self.assertEqual(got.returncode, 2, f"jinja2 failed ({want}) but slim gave: {stderr}")
                        self.assertTrue(stderr.startswith("slim: error [invalid_argument]: chat template line "), stderr)

    def test_every_family(self):
        families = template_files()
        self.assertGreaterEqual(len(families), 7)
        outcomes = {"ok": 0, "raise": 0, "error": 0}
        for name in families:
            path = os.path.join(TEMPLATES, name)
            with open(path, encoding="utf-8", newline="") as f:
                source = f.read()
            self.check(name, source, ["--template", path], outcomes)
        self.check("chatml", CHATML, ["--chatml"], outcomes)
        # The corpus exercises every path: renders, raise_exception messages, other errors.
        self.assertGreater(outcomes["ok"], 200)
        self.assertGreater(outcomes["raise"], 20)
        self.assertGreater(outcomes["error"], 5)

    def test_role_alternation_messages(self):
        # The exact messages the families raise for a conversation out of order.
        cases = {
            "llama2.jinja": "Conversation roles must alternate user/assistant/user/assistant/...",
            "mistral-v0.1.jinja": "Conversation roles must alternate user/assistant/user/assistant/...",
            "mistral-v0.3.jinja": "After the optional system message, conversation roles must alternate "
                                  "user/assistant/user/assistant/...",
            "gemma.jinja": "Conversation roles must alternate user/assistant/user/assistant/...",
        }
        for name, message in cases.items():
            with self.subTest(template=name):
                got = slim_render(["--template", os.path.join(TEMPLATES, name)], self.message_files["two_users"], True)
                self.assertEqual(got.returncode, 2)
                self.assertEqual(got.stderr.decode(), f"slim: error [invalid_argument]: {message}\n")

    def test_content_parts_are_joined(self):
        parts = [{"role": "user", "content": [{"type": "text", "text": "Hello, "}, {"type": "text", "text": "world"}]},
                 {"role": "assistant", "content": None}]
        path = write_json(self.tmp.name, "parts.json", parts)
        got = slim_render(["--chatml"], path, False)
        self.assertEqual(got.returncode, 0, got.stderr)
        self.assertEqual(got.stdout.decode(),
                         "<|im_start|>user\nHello, world<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n")
        bad = write_json(self.tmp.name, "bad_parts.json", [{"role": "user", "content": [{"type": "image_url"}]}])
        got = slim_render(["--chatml"], bad, True)
        self.assertEqual(got.returncode, 2)
        self.assertIn("message 0: content parts must be", got.stderr.decode())

    def test_gguf_template_and_special_tokens(self):
        with open(os.path.join(TEMPLATES, "zephyr.jinja"), encoding="utf-8") as f:
            zephyr = f.read()
        path = os.path.join(self.tmp.name, "zephyr.gguf")
        write_gguf(path, {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["<unk>", "<|bos|>", "<|eos|>"],
                          "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
                          "tokenizer.chat_template": zephyr})
        messages = CONVERSATIONS["system_multi_turn"]
        want = self.env.from_string(zephyr).render(messages=messages, bos_token="<|bos|>", eos_token="<|eos|>",
                                                   add_generation_prompt=True)
        got = subprocess.run(slim_command("chat-template", "--gguf", path, "--messages",
                                          self.message_files["system_multi_turn"]), capture_output=True, timeout=60)
        self.assertEqual(got.returncode, 0, got.stderr)
        self.assertEqual(got.stdout.decode(), want)
        # A model without a template gets ChatML, with a note on stderr.
        plain = os.path.join(self.tmp.name, "plain.gguf")
        write_gguf(plain, {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["a", "b"]})
        got = subprocess.run(slim_command("chat-template", "--gguf", plain, "--messages",
                                          self.message_files["user_only"]), capture_output=True, timeout=60)
        self.assertEqual(got.returncode, 0, got.stderr)
        self.assertEqual(got.stdout.decode(), "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")
        self.assertIn("has no tokenizer.chat_template; using ChatML", got.stderr.decode())

    def test_syntax_error_names_line_and_column(self):
        path = os.path.join(self.tmp.name, "broken.jinja")
        with open(path, "w") as f:
            f.write("{% for m in messages %}\n  {{ m.content + }}\n{% endfor %}")
        got = slim_render(["--template", path], self.message_files["user_only"], True)
        self.assertEqual(got.returncode, 2)
        self.assertEqual(got.stderr.decode(), "slim: error [invalid_argument]: chat template line 2:18: unexpected '}}'\n")

    def test_help_describes_the_command(self):
        got = subprocess.run(slim_command("chat-template", "--help"), capture_output=True, timeout=60)
        self.assertEqual(got.returncode, 0)
        out = got.stdout.decode()
        for option in ("--gguf", "--template", "--chatml", "--messages", "--no-generation-prompt", "--bos", "--eos"):
            self.assertIn(option, out)


if __name__ == "__main__":
    unittest.main()
