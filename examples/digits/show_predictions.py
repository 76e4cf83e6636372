#!/usr/bin/env python3
"""Prints held-out digits as text art beside slim's predictions, and how many of them
slim got right and how many agree with sklearn's own predictions.

Usage: show_predictions.py DATA_DIR PROBABILITIES.npy
"""
import os
import sys

import numpy as np


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        sys.exit(2)
    d = sys.argv[1]
    x = np.load(os.path.join(d, "digits.npy"))
    labels = np.load(os.path.join(d, "labels.npy"))
    ref = np.load(os.path.join(d, "sklearn_pred.npy"))
    probs = np.load(sys.argv[2])
    pred = probs.argmax(axis=1)
    shades = " .:-=+*#%@"
    for start in range(0, min(len(x), 8), 4):
        rows = [""] * 9
        for k in range(start, min(start + 4, len(x))):
            img = x[k].reshape(8, 8)
            for r in range(8):
                rows[r] += "".join(shades[min(9, int(v * 9 / 16))] * 2 for v in img[r]) + "   "
            rows[8] += f"slim {pred[k]}  true {labels[k]}".ljust(19)
        print("\n".join(rows) + "\n")
    print(f"slim predicted {int((pred == labels).sum())}/{len(labels)} held-out digits correctly; "
          f"agrees with sklearn on {int((pred == ref).sum())}/{len(ref)}")
    sys.exit(0 if (pred == ref).all() else 1)


if __name__ == "__main__":
    main()
