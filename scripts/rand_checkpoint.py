#!/usr/bin/python3
"""Write a random transformers-style DeepSeek V4 checkpoint (config.json +
model.safetensors) for golden tests of shapes the fixtures lack.

usage: scripts/rand_checkpoint.py OUT_DIR ['{"config overrides": ...}']   (BF16=1: bf16 weights)
The base config is tests/data/dsv4-tiny-a/config.json (hidden/moe 256 unless
overridden). Every tensor the reference initializes to a constant is random
(dsv4-model.md §7.3). Needs numpy. Run from the repository root.
"""
import json, struct, numpy as np, sys
out = sys.argv[1]
c = json.load(open('tests/data/dsv4-tiny-a/config.json'))
c['hidden_size'] = 256; c['moe_intermediate_size'] = 256
if len(sys.argv) > 2: c.update(json.loads(sys.argv[2]))
E=c['hidden_size']; F=c['moe_intermediate_size']
H=c['num_attention_heads']; D=c['head_dim']; QL=c['q_lora_rank']; OL=c['o_lora_rank']; G=c['o_groups']
NE=c['n_routed_experts']; K=c['num_experts_per_tok']; V=c['vocab_size']; IH=c['index_n_heads']; ID=c['index_head_dim']; HC=c['hc_mult']
rng = np.random.default_rng(7)
T = {}
def n(name, shape, s): T[name] = (rng.standard_normal(shape) * s).astype(np.float32)
def u(name, shape): T[name] = (0.5 + rng.random(shape)).astype(np.float32)
n('model.embed_tokens.weight', (V, E), 1.0); n('lm_head.weight', (V, E), E**-0.5)
n('model.hc_head.hc_fn', (HC, HC*E), (HC*E)**-0.5); n('model.hc_head.hc_base', (HC,), 0.5); u('model.hc_head.hc_scale', (1,)); u('model.norm.weight', (E,))
ratio = {'sliding_attention':0,'compressed_sparse_attention':4,'heavily_compressed_attention':c['compress_rates']['heavily_compressed_attention']}
for i, lt in enumerate(c['layer_types']):
    p = f'model.layers.{i}.'; r = ratio[lt]
    for site in ('attn_hc', 'ffn_hc'):
        n(p+site+'.fn', ((2+HC)*HC, HC*E), (HC*E)**-0.5); n(p+site+'.base', ((2+HC)*HC,), 0.5); u(p+site+'.scale', (3,))
    u(p+'input_layernorm.weight', (E,)); u(p+'post_attention_layernorm.weight', (E,))
    a = p+'self_attn.'
    n(a+'q_a_proj.weight', (QL, E), E**-0.5); u(a+'q_a_norm.weight', (QL,)); n(a+'q_b_proj.weight', (H*D, QL), QL**-0.5)
    n(a+'kv_proj.weight', (D, E), E**-0.5); u(a+'kv_norm.weight', (D,)); n(a+'sinks', (H,), 1.0)
    n(a+'o_a_proj.weight', (G*OL, H*D//G), (H*D//G)**-0.5); n(a+'o_b_proj.weight', (E, G*OL), (G*OL)**-0.5)
    if r:
        cw = (2 if r == 4 else 1) * D; q = a+'compressor.'
        n(q+'kv_proj.weight', (cw, E), E**-0.5); n(q+'gate_proj.weight', (cw, E), E**-0.5); n(q+'position_bias', (r, cw), 0.5); u(q+'kv_norm.weight', (D,))
    if r == 4:
        q = a+'compressor.indexer.'
        n(q+'q_b_proj.weight', (IH*ID, QL), QL**-0.5); n(q+'scorer.weights_proj.weight', (IH, E), E**-0.5)
        n(q+'kv_proj.weight', (2*ID, E), E**-0.5); n(q+'gate_proj.weight', (2*ID, E), E**-0.5); n(q+'position_bias', (4, 2*ID), 0.5); u(q+'kv_norm.weight', (ID,))
    m = p+'mlp.'
    n(m+'gate.weight', (NE, E), E**-0.5)
    if c['mlp_layer_types'][i] == 'hash_moe':
        T[m+'gate.tid2eid'] = np.stack([rng.permutation(NE)[:K] for _ in range(V)]).astype(np.int32)
    else:
        n(m+'gate.e_score_correction_bias', (NE,), 0.1)
    n(m+'experts.gate_up_proj', (NE, 2*F, E), E**-0.5); n(m+'experts.down_proj', (NE, E, F), F**-0.5)
    n(m+'shared_experts.gate_proj.weight', (F, E), E**-0.5); n(m+'shared_experts.up_proj.weight', (F, E), E**-0.5); n(m+'shared_experts.down_proj.weight', (E, F), F**-0.5)
hdr = {}; off = 0; blobs = []
import os
for k, v in T.items():
    if os.environ.get('BF16') and v.dtype == np.float32:
        u = v.view(np.uint32).astype(np.uint64); u = ((u + 0x7fff + ((u >> 16) & 1)) >> 16).astype(np.uint16)
        b = u.tobytes(); hdr[k] = {'dtype': 'BF16', 'shape': list(v.shape), 'data_offsets': [off, off+len(b)]}; off += len(b); blobs.append(b); continue
    b = v.tobytes(); hdr[k] = {'dtype': 'I32' if v.dtype == np.int32 else 'F32', 'shape': list(v.shape), 'data_offsets': [off, off+len(b)]}; off += len(b); blobs.append(b)
h = json.dumps(hdr).encode(); h += b' ' * ((-len(h)) % 8)
open(out+'/model.safetensors','wb').write(struct.pack('<Q', len(h)) + h + b''.join(blobs))
json.dump(c, open(out+'/config.json','w'), indent=1)
print('ok', len(T))
