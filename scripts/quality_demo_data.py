#!/usr/bin/env python3
"""quality_demo_data.py - data for the imatrix experiment of docs/QUALITY.md.

    python3 scripts/quality_demo_data.py CALIB.jsonl PROMPTS.jsonl [--calib N] [--prompts N]

CALIB.jsonl: N chat conversations ({"messages": [...]}: user question,
assistant answer) drawn from the demo model's training distribution
(tools/train_demo/make_data.py's question generator, seed 1001), the
calibration text `ds4 --imatrix-dataset` renders in the chat format.
PROMPTS.jsonl: N held-out questions ({"id", "prompt"}, seed 2002, a seed
neither the training nor the calibration used) for `ds4-quality manifest`.
"""
import argparse, json, os, random, sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools", "train_demo"))
import make_data  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("calib")
ap.add_argument("prompts")
ap.add_argument("--calib-n", type=int, default=300)
ap.add_argument("--prompts-n", type=int, default=100)
a = ap.parse_args()
rng = random.Random(1001)
with open(a.calib, "w", encoding="utf-8") as f:
    for _ in range(a.calib_n):
        q, _, ans = make_data.qa(rng)
        msgs = [{"role": "user", "content": q}, {"role": "assistant", "content": ans}]
        f.write(json.dumps({"messages": msgs}, ensure_ascii=False) + "\n")
rng = random.Random(2002)
with open(a.prompts, "w", encoding="utf-8") as f:
    for i in range(a.prompts_n):
        q, _, _ = make_data.qa(rng)
        f.write(json.dumps({"id": f"q{i:03d}", "prompt": q}, ensure_ascii=False) + "\n")
