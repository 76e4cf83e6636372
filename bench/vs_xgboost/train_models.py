#!/usr/bin/env python3
"""Trains the two benchmark models on synthetic data with 30 features:
100 trees of depth 6 and 1000 trees of depth 8.  usage: train_models.py OUT_DIR"""
import os
import sys

import numpy as np
import xgboost as xgb

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
rng = np.random.default_rng(0)
n, f = 20000, 30
x = rng.normal(size=(n, f)).astype(np.float32)
w = rng.normal(size=f)
logit = x @ w * 0.5 + np.sin(x[:, 0] * 3) + x[:, 1] * x[:, 2]
y = (logit + rng.logistic(size=n) > 0).astype(np.float32)
d = xgb.DMatrix(x, y)
for trees, depth in [(100, 6), (1000, 8)]:
    path = os.path.join(out, f"xgb_{trees}x{depth}.json")
    if os.path.exists(path):
        continue
    b = xgb.train({"objective": "binary:logistic", "max_depth": depth, "eta": 0.05,
                   "tree_method": "hist", "nthread": 2, "seed": 0}, d, trees)
    b.save_model(path)
    print("trained", path, flush=True)
