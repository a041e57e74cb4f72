"""Trains the DwarfStar demo model: a small DeepseekV4ForCausalLM of the real
architecture (mHC, sliding/CSA/HCA attention, hash and top-k MoE) with the
real DeepSeek V4 tokenizer, on the data of make_data.py.

Runs on the GPU machine (torch + transformers >= 5.17 + tokenizers):

  python3 tools/train_demo/train.py --tokenizer tests/data/tokenizer/dsv4-tokenizer.json \
      --prose tests/data/bench/promessi_sposi.txt --out OUTDIR [--steps N]

Writes OUTDIR/config.json + OUTDIR/model.safetensors (transformers names,
bf16 weights) and OUTDIR/train_log.json (losses). Convert with ds4-quantize.
Deterministic for a given seed and GPU (seeded data, init and batch order).
"""
import argparse, json, math, os, random, sys, time

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from tokenizers import Tokenizer
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_data  # noqa: E402

CSA, HCA, SWA = "compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention"
YARN = {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 65536,
        "beta_fast": 32.0, "beta_slow": 1.0}

CONFIG = dict(vocab_size=129280, hidden_size=64, moe_intermediate_size=128, num_hidden_layers=6,
              num_attention_heads=4, num_key_value_heads=1, head_dim=64, q_lora_rank=64,
              partial_rotary_factor=16 / 64, num_experts_per_tok=2, n_routed_experts=8,
              n_shared_experts=1, layer_types=[SWA, SWA, CSA, HCA, CSA, HCA],
              compress_rates={CSA: 4, HCA: 32},
              mlp_layer_types=["hash_moe"] * 3 + ["moe"] * 3, hc_mult=4, hc_sinkhorn_iters=20,
              sliding_window=64, o_groups=2, o_lora_rank=32, index_n_heads=4, index_head_dim=32,
              index_topk=16, rope_parameters=dict(YARN), bos_token_id=0, eos_token_id=1,
              tie_word_embeddings=False)


def stable_topk(x, k, dim=-1, largest=True, sorted=True):
    # The engine's tie rule for the indexer (higher score, then lower index).
    vals, idx = torch.sort(x, dim=dim, descending=largest, stable=True)
    return torch.return_types.topk((vals.narrow(dim, 0, k), idx.narrow(dim, 0, k)))


def encode_examples(tok, examples):
    seqs = []
    for segs in examples:
        ids, mask = [], []
        for text, trainable in segs:
            t = tok.encode(text, add_special_tokens=False).ids
            ids += t
            mask += [1 if trainable else 0] * len(t)
        seqs.append((ids, mask))
    return seqs


def pack(seqs, T, rng):
    """Greedy packing of whole examples into rows of T tokens (pad = EOS, masked)."""
    rng.shuffle(seqs)
    rows, cur_i, cur_m = [], [], []
    for ids, m in seqs:
        ids, m = ids[:T], m[:T]
        if len(cur_i) + len(ids) > T:
            pad = T - len(cur_i)
            rows.append((cur_i + [1] * pad, cur_m + [0] * pad))
            cur_i, cur_m = [], []
        cur_i += ids
        cur_m += m
    if cur_i:
        pad = T - len(cur_i)
        rows.append((cur_i + [1] * pad, cur_m + [0] * pad))
    x = torch.tensor([r[0] for r in rows], dtype=torch.long)
    m = torch.tensor([r[1] for r in rows], dtype=torch.float32)
    return x, m


def init_hash_tables(model, cfg, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("tid2eid"):
                vocab, k = b.shape
                r = torch.rand(vocab, cfg.n_routed_experts, generator=g)
                b.copy_(r.argsort(dim=1)[:, :k].to(b.dtype))


def masked_loss(model, x, m):
    logits = model(input_ids=x, use_cache=False).logits.float()
    lp = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="none")
    w = m[:, 1:].reshape(-1)
    return (lp * w).sum() / w.sum().clamp(min=1)


def greedy(model, tok, prompt, n=40):
    ids = tok.encode(prompt, add_special_tokens=False).ids
    for _ in range(n):
        with torch.no_grad():
            lg = model(input_ids=torch.tensor([ids], device="cuda"), use_cache=False).logits[0, -1]
        nxt = int(lg.argmax())
        ids.append(nxt)
        if nxt == 1:
            break
    return tok.decode(ids, skip_special_tokens=False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--prose", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--time-limit", type=float, default=0, help="stop early after this many seconds")
    a = ap.parse_args()

    torch.manual_seed(a.seed)
    random.seed(a.seed)
    torch.topk = stable_topk
    torch.Tensor.topk = lambda self, k, dim=-1, largest=True, sorted=True: stable_topk(self, k, dim, largest, sorted)
    torch.backends.cuda.matmul.allow_tf32 = True

    tok = Tokenizer.from_file(a.tokenizer)
    text = open(a.prose, encoding="utf-8").read()
    rng = random.Random(a.seed)
    train_ex = [make_data.chat_example(rng) for _ in range(30000)] + \
               [make_data.tool_example(rng) for _ in range(15000)] + make_data.prose_examples(text, rng, 3000)
    heldout_rng = random.Random(a.seed + 1000)
    held_ex = [make_data.chat_example(heldout_rng) for _ in range(200)] + \
              [make_data.tool_example(heldout_rng) for _ in range(100)]
    t0 = time.time()
    x_train, m_train = pack(encode_examples(tok, train_ex), a.seq, rng)
    x_held, m_held = pack(encode_examples(tok, held_ex), a.seq, heldout_rng)
    print(f"data: {x_train.shape[0]} rows x {a.seq} ({m_train.sum():.0f} target tokens), "
          f"heldout {x_held.shape[0]} rows, {time.time() - t0:.1f}s", flush=True)

    cfg = DeepseekV4Config(**CONFIG)
    cfg._attn_implementation = "eager"
    model = DeepseekV4ForCausalLM(cfg)
    init_hash_tables(model, cfg, a.seed + 1)
    model = model.cuda()
    nparam = sum(p.numel() for p in model.parameters())
    print(f"params: {nparam / 1e6:.2f} M", flush=True)

    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.01)
    warm = max(1, a.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / a.steps))))
    log = {"config": CONFIG, "steps": [], "args": vars(a)}
    order = torch.randperm(x_train.shape[0], generator=torch.Generator().manual_seed(a.seed))
    pos = 0
    t0 = time.time()
    model.train()
    for step in range(a.steps):
        if pos + a.batch > len(order):
            pos = 0
        idx = order[pos:pos + a.batch]
        pos += a.batch
        x, m = x_train[idx].cuda(), m_train[idx].cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = masked_loss(model, x, m)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 25 == 0 or step == a.steps - 1:
            el = time.time() - t0
            print(f"step {step} loss {loss.item():.4f} lr {sched.get_last_lr()[0]:.2e} {el:.0f}s", flush=True)
            log["steps"].append({"step": step, "loss": loss.item(), "seconds": el})
        if a.time_limit and time.time() - t0 > a.time_limit:
            print(f"time limit at step {step}", flush=True)
            break
    model.eval()
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        hl = [masked_loss(model, x_held[i:i + 8].cuda(), m_held[i:i + 8].cuda()).item()
              for i in range(0, x_held.shape[0], 8)]
    log["heldout_loss"] = sum(hl) / len(hl)
    log["train_seconds"] = time.time() - t0
    print(f"heldout loss {log['heldout_loss']:.4f}", flush=True)
    for p in ["<｜begin▁of▁sentence｜>You are a helpful assistant<｜User｜>What is the capital of France?<｜Assistant｜></think>",
              "<｜begin▁of▁sentence｜><｜User｜>What is 12 + 7?<｜Assistant｜><think>"]:
        s = greedy(model.float(), tok, p)
        print("sample:", repr(s[len(p):]), flush=True)
        log.setdefault("samples", []).append(s)

    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg.to_dict(), f, indent=1, default=str)
    sd = {}
    for k, v in model.state_dict().items():
        v = v.detach().cpu()
        if v.dtype in (torch.long, torch.int64, torch.int32):
            sd[k] = v.to(torch.int32).contiguous()
        elif "e_score_correction_bias" in k:
            sd[k] = v.float().contiguous()
        else:
            sd[k] = v.to(torch.bfloat16).contiguous()
    save_file(sd, os.path.join(a.out, "model.safetensors"))
    with open(os.path.join(a.out, "train_log.json"), "w") as f:
        json.dump(log, f, indent=1)
    print("saved", a.out, flush=True)


if __name__ == "__main__":
    main()
