#!/usr/bin/env python3
"""Real credit-risk data: modeldata's credit_data (4,454 applicants, exported with
Rscript from Debian's r-cran-modeldata), an XGBoost model trained on 75 %, and held-out
AUC / logloss / file size for the original model and slim's lossless, 6-bit and pruned
variants, each predicted by the `slim` CLI.

usage: credit_eval.py SLIM_BINARY WORK_DIR [--prune-gain X]
Needs r-base-core and r-cran-modeldata (apt-get install -y r-base-core r-cran-modeldata).
"""
import argparse
import os
import subprocess
import sys

import numpy as np
import xgboost as xgb
from sklearn.metrics import log_loss, roc_auc_score
from sklearn.model_selection import train_test_split

R_EXPORT = r"""
data(credit_data, package = "modeldata")
d <- credit_data
d$Status <- as.integer(d$Status == "bad")
for (col in names(d)) if (is.factor(d[[col]])) d[[col]] <- as.integer(d[[col]]) - 1L
write.csv(d, file = commandArgs(trailingOnly = TRUE)[1], row.names = FALSE, na = "")
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("slim")
    ap.add_argument("work")
    ap.add_argument("--prune-gain", type=float, default=2.0)
    ap.add_argument("--trees", type=int, default=300)
    ap.add_argument("--depth", type=int, default=5)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    csv = os.path.join(a.work, "credit_data.csv")
    if not os.path.exists(csv):
        subprocess.run(["Rscript", "-e", R_EXPORT, csv], check=True)
    with open(csv) as f:
        header = f.readline().strip().replace('"', "").split(",")
    data = np.genfromtxt(csv, delimiter=",", skip_header=1, dtype=np.float32, missing_values="",
                         filling_values=np.nan)
    y, x = data[:, 0], data[:, 1:]
    features = header[1:]
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.25, random_state=7, stratify=y)
    print(f"credit_data: {len(y)} rows, {x.shape[1]} features, {int(y.sum())} bad; "
          f"train {len(y_tr)}, held-out {len(y_te)}")

    model = os.path.join(a.work, "credit_xgb.json")
    b = xgb.train({"objective": "binary:logistic", "max_depth": a.depth, "eta": 0.05,
                   "subsample": 0.8, "colsample_bytree": 0.8, "min_child_weight": 2,
                   "tree_method": "hist", "nthread": 2, "seed": 0},
                  xgb.DMatrix(x_tr, y_tr, feature_names=features), a.trees)
    b.save_model(model)
    p_xgb = b.predict(xgb.DMatrix(x_te, feature_names=features))

    train_csv = os.path.join(a.work, "train_features.csv")
    test_csv = os.path.join(a.work, "test_labelled.csv")
    np.savetxt(train_csv, x_tr, delimiter=",", fmt="%.9g", header=",".join(features), comments="")
    np.savetxt(test_csv, np.column_stack([y_te, x_te]), delimiter=",", fmt="%.9g",
               header=",".join(header), comments="")

    variants = [
        ("original (XGBoost JSON)", None, []),
        ("slimf plain", "plain.slimf", []),
        ("slimf lossless (ranked, mmap)", "lossless.slimf", ["--quantize", "lossless"]),
        ("slimf lossless (compact file)", "lossless.c.slimf", ["--quantize", "lossless", "--encoding", "compact"]),
        ("slimf 6-bit (ranked, mmap)", "6bit.slimf", ["--quantize", "6bit", "--calib", train_csv]),
        ("slimf 6-bit (compact file)", "6bit.c.slimf",
         ["--quantize", "6bit", "--calib", train_csv, "--encoding", "compact"]),
        (f"slimf pruned (gain<{a.prune_gain:g}, lossless, compact)", "pruned.slimf",
         ["--quantize", "lossless", "--prune-gain", str(a.prune_gain), "--encoding", "compact"]),
        (f"slimf pruned + 6-bit (compact)", "pruned6.slimf",
         ["--quantize", "6bit", "--calib", train_csv, "--prune-gain", str(a.prune_gain), "--encoding", "compact"]),
    ]
    base_auc = roc_auc_score(y_te, p_xgb)
    print(f"\n{'variant':48s} {'size':>12s} {'ratio':>7s} {'AUC':>9s} {'dAUC':>9s} {'logloss':>9s} {'same as xgb':>12s}")
    orig_size = os.path.getsize(model)
    plain_size = None
    for name, out, args in variants:
        path = model if out is None else os.path.join(a.work, out)
        if out is not None:
            subprocess.run([a.slim, "forest", "compile", model, "-o", path] + args, check=True,
                           stdout=subprocess.DEVNULL)
        pred_csv = os.path.join(a.work, (out or "original") + ".pred.csv")
        subprocess.run([a.slim, "forest", "predict", path, "--csv", test_csv, "--label-column",
                        "Status", "--output", pred_csv], check=True, stderr=subprocess.DEVNULL)
        p = np.loadtxt(pred_csv, delimiter=",", skiprows=1, dtype=np.float32)
        size = os.path.getsize(path)
        if out == "plain.slimf":
            plain_size = size
        ref = plain_size or orig_size
        auc = roc_auc_score(y_te, p)
        same = int(np.sum(p == p_xgb.astype(np.float32)))
        print(f"{name:48s} {size / 1024:9.1f} KiB {ref / size:6.2f}x {auc:9.5f} {auc - base_auc:+9.5f} "
              f"{log_loss(y_te, np.clip(p, 1e-15, 1 - 1e-15)):9.5f} {same:6d}/{len(p)}")
    print(f"\n(xgboost's own held-out AUC {base_auc:.5f}; ratio is against the plain .slimf, "
          f"the original row against itself)")


if __name__ == "__main__":
    sys.exit(main())
