# Extra golden cases beyond the shared dsv4-tiny-a fixture: other tiny
# configurations of the same architecture, so the engine is not tuned to one.
# Runs on a machine with torch + transformers >= 5.17 (the GPU machine):
#
#   python3 tools/golden/extra_cases.py OUTDIR [case ...]
#
# Each case lands in OUTDIR/<case>/ in the layout of make_golden.py.
import sys

import make_golden as mg

SWA, CSA, HCA = mg.SWA, mg.CSA, mg.HCA

mg.CASES.update({
    # Wider model, more heads and groups, HCA ratio shrunk to 16 so several
    # HCA windows close inside the sequence, small window (16) so the raw ring
    # wraps many times, 16 experts top-4, three hash layers.
    "tiny-b": dict(
        seed=2002, seq_lens=[300], hidden=False,
        cfg=dict(vocab_size=777, hidden_size=256, moe_intermediate_size=32, num_hidden_layers=5,
                 num_attention_heads=8, num_key_value_heads=1, head_dim=64, q_lora_rank=96,
                 partial_rotary_factor=32 / 64, num_experts_per_tok=4, n_routed_experts=16,
                 n_shared_experts=1, layer_types=[SWA, CSA, HCA, CSA, HCA],
                 compress_rates={CSA: 4, HCA: 16},
                 mlp_layer_types=["hash_moe"] * 3 + ["moe"] * 2, hc_mult=4, hc_sinkhorn_iters=20,
                 sliding_window=16, o_groups=4, o_lora_rank=48, index_n_heads=2, index_head_dim=32,
                 index_topk=8, rope_parameters=dict(mg.YARN), bos_token_id=0, eos_token_id=1)),
    # Pro-like layer pattern (no sliding-only layers: HCA, HCA, CSA, HCA),
    # one hash layer, top-1 routing, odd sequence length.
    "tiny-c": dict(
        seed=3003, seq_lens=[257], hidden=False,
        cfg=dict(vocab_size=512, hidden_size=64, moe_intermediate_size=32, num_hidden_layers=4,
                 num_attention_heads=2, num_key_value_heads=1, head_dim=32, q_lora_rank=16,
                 partial_rotary_factor=8 / 32, num_experts_per_tok=1, n_routed_experts=4,
                 n_shared_experts=1, layer_types=[HCA, HCA, CSA, HCA],
                 compress_rates={CSA: 4, HCA: 32},
                 mlp_layer_types=["hash_moe"] + ["moe"] * 3, hc_mult=4, hc_sinkhorn_iters=20,
                 sliding_window=8, o_groups=1, o_lora_rank=8, index_n_heads=2, index_head_dim=16,
                 index_topk=4, rope_parameters=dict(mg.YARN), bos_token_id=0, eos_token_id=1)),
})

if __name__ == "__main__":
    out = sys.argv[1]
    for name in sys.argv[2:] or ["tiny-b", "tiny-c"]:
        mg.run_case(out, name, mg.CASES[name])
