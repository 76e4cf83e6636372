#!/usr/bin/python3
"""Exports the vs_ort benchmark models with random weights (speed does not depend on
the weights): ResNet-18, MobileNetV2 and SqueezeNet 1.1 from torchvision, and a 6-layer
BERT-style encoder (hidden 768, 12 heads, FFN 3072, sequence length 128), and speech-sized
2-layer LSTMs (hidden 64 and 128) and GRU (hidden 128) at 1 and 100 steps. The batch dim
is symbolic, so one file serves batch 1 and 8."""
import math
import os
import sys

import torch
import torch.nn as nn
import torchvision

OPSET = 17


class EncoderLayer(nn.Module):
    """Post-norm BERT layer written out (q/k/v projections, scaled softmax attention,
    GELU feed-forward), so the export is plain MatMul/Add/Softmax/LayerNorm nodes."""

    def __init__(self, hidden, heads, ffn):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.q = nn.Linear(hidden, hidden)
        self.k = nn.Linear(hidden, hidden)
        self.v = nn.Linear(hidden, hidden)
        self.o = nn.Linear(hidden, hidden)
        self.ln1 = nn.LayerNorm(hidden, eps=1e-12)
        self.ff1 = nn.Linear(hidden, ffn)
        self.ff2 = nn.Linear(ffn, hidden)
        self.ln2 = nn.LayerNorm(hidden, eps=1e-12)
        self.act = nn.GELU()

    def forward(self, x):
        b, s, h = x.shape
        def split(t):
            return t.view(b, s, self.heads, self.head_dim).transpose(1, 2)
        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(self.head_dim), dim=-1)
        ctx = (att @ v).transpose(1, 2).reshape(b, s, h)
        x = self.ln1(x + self.o(ctx))
        return self.ln2(x + self.ff2(self.act(self.ff1(x))))


class Encoder(nn.Module):
    def __init__(self, vocab=8000, seq=128, hidden=768, heads=12, ffn=3072, layers=6):
        super().__init__()
        self.tok = nn.Embedding(vocab, hidden)
        self.pos = nn.Parameter(torch.randn(1, seq, hidden) * 0.02)
        self.ln = nn.LayerNorm(hidden, eps=1e-12)
        self.layers = nn.ModuleList(EncoderLayer(hidden, heads, ffn) for _ in range(layers))

    def forward(self, input_ids):
        x = self.ln(self.tok(input_ids) + self.pos)
        for layer in self.layers:
            x = layer(x)
        return x


class SpeechRnn(nn.Module):
    """A speech model's recurrent core (Silero VAD style): 2 stacked LSTM or GRU layers,
    batch 1, the state passed in and out by the caller at every call."""

    def __init__(self, kind, hidden):
        super().__init__()
        self.kind = kind
        self.rnn = (nn.LSTM if kind == "lstm" else nn.GRU)(hidden, hidden, num_layers=2)

    def forward(self, x, h, c=None):
        if self.kind == "lstm":
            y, (h, c) = self.rnn(x, (h, c))
            return y, h, c
        y, h = self.rnn(x, h)
        return y, h


# name: (kind, hidden, steps); the state inputs are [layers, batch, hidden].
RNN_MODELS = {f"{kind}_h{hidden}_t{steps}": (kind, hidden, steps)
              for kind, hidden in [("lstm", 64), ("lstm", 128), ("gru", 128)] for steps in (1, 100)}


def export_rnn(name, path):
    kind, hidden, steps = RNN_MODELS[name]
    model = SpeechRnn(kind, hidden).eval()
    states = ["h", "c"] if kind == "lstm" else ["h"]
    example = (torch.randn(steps, 1, hidden),) + tuple(torch.zeros(2, 1, hidden) for _ in states)
    outputs = ["y"] + [s + "_out" for s in states]
    with torch.no_grad():
        torch.onnx.export(model, example, path, opset_version=OPSET, input_names=["x"] + states,
                          output_names=outputs, dynamic_axes={n: {1: "batch"} for n in ["x"] + states + outputs},
                          do_constant_folding=True)
    print("wrote", path, f"({os.path.getsize(path) / 1e6:.1f} MB)")


def export(model, example, path, input_name):
    model.eval()
    with torch.no_grad():
        torch.onnx.export(model, example, path, opset_version=OPSET, input_names=[input_name],
                          output_names=["output"],
                          dynamic_axes={input_name: {0: "batch"}, "output": {0: "batch"}},
                          do_constant_folding=True)
    print("wrote", path, f"({os.path.getsize(path) / 1e6:.1f} MB)")


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(0)
    image = torch.randn(1, 3, 224, 224)
    for name, ctor in [("resnet18", torchvision.models.resnet18),
                       ("mobilenet_v2", torchvision.models.mobilenet_v2),
                       ("squeezenet1_1", torchvision.models.squeezenet1_1)]:
        path = os.path.join(out_dir, name + ".onnx")
        if not os.path.exists(path):
            export(ctor(weights=None), image, path, "input")
    path = os.path.join(out_dir, "bert6.onnx")
    if not os.path.exists(path):
        export(Encoder(), torch.randint(0, 8000, (1, 128)), path, "input_ids")
    for name in RNN_MODELS:
        path = os.path.join(out_dir, name + ".onnx")
        if not os.path.exists(path):
            export_rnn(name, path)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".work"))
