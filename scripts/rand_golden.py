#!/usr/bin/python3
"""Golden logits for a checkpoint directory from the independent NumPy model
of the spec (shared/tools/dsv4_ref.py; DSV4_REF_DIR overrides where it is).

usage: scripts/rand_golden.py DIR N_TOKENS SEED NAME
Writes DIR/logits0.f32 ([N, vocab] f32, full-sequence path) and
DIR/manifest.json (tokens; the streaming path's max difference as a check).
"""
import sys, os, json, numpy as np
sys.path.insert(0, os.environ.get('DSV4_REF_DIR', os.path.join(os.path.dirname(os.path.abspath(__file__)), '../../shared/tools')))
import dsv4_ref as ref
d, n, seed, name = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
m = ref.Model(d)
rng = np.random.default_rng(seed)
toks = [0] + list(rng.integers(2, m.V, n - 1))
out = ref.forward_full(m, np.array(toks)).astype('<f4')
out.tofile(d + '/logits0.f32')
dec = ref.Decoder(m); K = n // 3
st = np.concatenate([dec.prefill(toks[:K])] + [dec.step(t)[None] for t in toks[K:]])
man = {"case": name, "made_by": "shared/tools/dsv4_ref.py (NumPy, float32) forward_full; random weights (seeded)",
       "indexer_topk_ties": "higher score first, equal scores by lower index",
       "sequences": [{"tokens": [int(t) for t in toks], "logits": "logits0.f32", "shape": [n, m.V],
                      "logit_std": float(out.std()), "reference_streaming_vs_full_max_abs": float(np.abs(st - out).max())}]}
json.dump(man, open(d + '/manifest.json', 'w'), indent=1)
print(name, 'std', out.std(), 'stream vs full', np.abs(st - out).max())
