#!/usr/bin/python3
"""Writes the bench/serve models and their inputs into OUT_DIR (random weights: speed does
not depend on them).

  digits/        examples/digits/make_digits_model.py: the trained digits MLP and its data;
                 digit1.npy, one held-out image (f32[1,64])
  resnet18_32.onnx  torchvision ResNet-18 on 32x32 images (CIFAR-sized, 37 MFLOP a
                 sample instead of 1.8 GFLOP at 224x224, so a 2-core machine runs enough
                 batches in a bounded run); image1.npy f32[1,3,32,32]
  bert_mini.onnx the BERT-style encoder of bench/vs_ort/export_models.py at BERT-mini's
                 size (4 layers, hidden 256, 4 heads, FFN 1024) and sequence length 64;
                 ids1.npy i64[1,64]
Files already there are kept.
"""
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "vs_ort"))


def main(out):
    os.makedirs(out, exist_ok=True)
    digits = os.path.join(out, "digits")
    if not os.path.exists(os.path.join(digits, "digits_mlp.onnx")):
        subprocess.run([sys.executable, os.path.join(HERE, "..", "..", "examples", "digits", "make_digits_model.py"),
                        digits], check=True, stdout=subprocess.DEVNULL)
    np.save(os.path.join(out, "digit1.npy"), np.load(os.path.join(digits, "digits.npy"))[:1])

    import torch
    import torchvision
    from export_models import Encoder, export
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    path = os.path.join(out, "resnet18_32.onnx")
    if not os.path.exists(path):
        export(torchvision.models.resnet18(weights=None), torch.randn(1, 3, 32, 32), path, "input")
    np.save(os.path.join(out, "image1.npy"), rng.standard_normal((1, 3, 32, 32)).astype(np.float32))
    path = os.path.join(out, "bert_mini.onnx")
    if not os.path.exists(path):
        export(Encoder(vocab=8000, seq=64, hidden=256, heads=4, ffn=1024, layers=4),
               torch.randint(0, 8000, (1, 64)), path, "input_ids")
    np.save(os.path.join(out, "ids1.npy"), rng.integers(0, 8000, (1, 64), dtype=np.int64))


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if len(sys.argv) == 2 else 2)
    main(sys.argv[1])
