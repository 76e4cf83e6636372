#!/usr/bin/env python3
"""Writes chat.gguf, a small random-weight Llama with a real byte-level BPE tokenizer (every
byte has a token, a few merges, ChatML's special tokens) and a ChatML chat template, for the
language-model serving tests; with --moe, chat-moe.gguf instead: the same tokenizer on a
qwen2moe model (3 layers, 4 experts of 64 hidden units, 2 per token, a shared expert of 96).
Usage: make_llm.py OUT_DIR [--moe | --long]

--long writes chat-long.gguf instead: the same model with a context of 4096 tokens, for a
request that must stay in flight for seconds."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures"))
import make_gguf  # noqa: E402


def byte_symbols():
    """GPT-2's byte-level alphabet: printable bytes stand for themselves, the others are
    shifted past 255 so that every token is printable text."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, shift = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + shift)
            shift += 1
    return [out[b] for b in range(256)]


CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    tokens = byte_symbols()
    merges = ["Ġ t", "h e", "Ġt he", "i n", "e r", "a n", "Ġ a", "o n", "r e", "Ġ s"]
    for m in merges:
        tokens.append(m.replace(" ", ""))
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    types = [1] * len(tokens) + [3] * len(specials)
    tokens += specials
    eot = tokens.index("<|endoftext|>")
    tokenizer = [("tokenizer.ggml.model", ("str", "gpt2")), ("tokenizer.ggml.pre", ("str", "gpt-2")),
                 ("tokenizer.ggml.tokens", ("strs", tokens)), ("tokenizer.ggml.token_type", ("i32s", types)),
                 ("tokenizer.ggml.merges", ("strs", merges)),
                 ("tokenizer.ggml.bos_token_id", ("u32", eot)), ("tokenizer.ggml.eos_token_id", ("u32", eot)),
                 ("tokenizer.ggml.add_bos_token", ("bool", False)),
                 ("tokenizer.chat_template", ("str", CHATML))]
    # Logits of printable ASCII tokens and the merges spread wide, the others stay at 0:
    # greedy output is readable text (stop strings can be picked from it) and seldom ends.
    scale = [4.0 if (len(t) > 1 and not t.startswith("<|")) or (len(t) == 1 and " " < t <= "~") else 0.0
             for t in tokens]
    if "--moe" in sys.argv[2:]:
        make_gguf.make_model(out, "chat-moe", "qwen2moe", "F32", 2, False, 78, n_embd=128, n_head=4, n_ff=64,
                             n_layer=3, vocab=len(tokens), tokenizer=tokenizer, n_ctx=512, output_scale=scale,
                             moe=dict(n_expert=4, k=2, n_ff_sh=96), reference=False)
    else:
        name, n_ctx = ("chat-long", 4096) if "--long" in sys.argv[2:] else ("chat", 512)
        make_gguf.make_model(out, name, "llama", "F32", 2, False, 77, n_embd=128, n_head=4, n_ff=256, n_layer=2,
                             vocab=len(tokens), tokenizer=tokenizer, n_ctx=n_ctx, output_scale=scale)
        for extra in ("tokens", "logits", "emul", "deq"):  # make_model's checks for the llm tests
            os.remove(os.path.join(out, "%s.%s.npy" % (name, extra)))


if __name__ == "__main__":
    main()
