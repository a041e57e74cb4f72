"""Trains an MTP block for the demo model on top of the frozen model and
writes it as a separate MTP GGUF (mtp.0.* tensors, F32), plus a fixture of
reference MTP logits computed by the PyTorch block (mtp_torch.py).

  make ds4-mtp-data
  python3 tools/train_demo/mtp_texts.py .devwork/mtp_texts.txt
  ./ds4-mtp-data -m models/ds4-demo.gguf --texts .devwork/mtp_texts.txt --out .devwork/mtp
  python3 tools/train_demo/train_mtp.py --model models/ds4-demo.gguf --data .devwork/mtp \\
      --out models/ds4-demo-mtp.gguf --fixture tests/data/mtp [--steps N]

The main model's states come from our own runs (ds4-mtp-data); the block
learns, at MTP position i, from (h_i, x_{i+1}) to predict x_{i+2}, the
DeepSeek V3/V4 training pairing. Its decoder weights start from the main
model's last layer. The cross-entropy is taken over the tokens that occur
in the data (a few thousand of the 129280): the head stays the main
model's, so this only saves the time of the full softmax. Runs on a CPU
(torch >= 1.13); deterministic for a seed.
"""
import argparse, json, os, struct, sys, time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_io  # noqa: E402
from mtp_torch import MTP, NAMES, OWN, Cfg, gguf_name  # noqa: E402


def load_data(prefix, HC, E):
    tok = torch.frombuffer(bytearray(open(prefix + ".tokens", "rb").read()), dtype=torch.int32).long()
    hid = torch.frombuffer(bytearray(open(prefix + ".hidden", "rb").read()), dtype=torch.float16)
    hid = hid.reshape(-1, HC, E)
    texts, at, start = [], 0, 0
    for i, t in enumerate(tok.tolist()):
        if t == -1:
            n = i - start
            texts.append((tok[start:i], hid[at:at + n]))
            at += n
            start = i + 1
    assert at == hid.shape[0], (at, hid.shape)
    return texts


def chunks(texts, S):
    """(h [S, HC, E], x_next [S], target [S] or -1) windows of MTP positions."""
    out = []
    for toks, h in texts:
        L = toks.shape[0]
        for s0 in range(0, L - 1, S):
            n = min(S, L - 1 - s0)
            tgt = torch.full((S,), -1, dtype=torch.long)
            k = max(0, min(n, L - 2 - s0))
            tgt[:k] = toks[s0 + 2:s0 + 2 + k]
            xn = torch.zeros(S, dtype=torch.long)
            xn[:n] = toks[s0 + 1:s0 + 1 + n]
            hh = torch.zeros(S, h.shape[1], h.shape[2], dtype=torch.float16)
            hh[:n] = h[s0:s0 + n]
            out.append((hh, xn, tgt))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--fixture", default="")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--time-limit", type=float, default=0, help="stop training after this many seconds")
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    if a.threads:
        torch.set_num_threads(a.threads)
    r = gguf_io.Reader(a.model)
    c = Cfg(r.meta)
    emb = r.tensor("token_embd.weight")
    head = r.tensor("output.weight")
    last = r.meta["deepseek4.block_count"] - 1
    init = {}
    for n in NAMES:
        init[n] = r.tensor(f"blk.{last}.{n}.weight")
    init["exp_probs_b"] = r.tensor(f"blk.{last}.exp_probs_b.bias")
    g = torch.Generator().manual_seed(a.seed)
    init["e_proj"] = torch.randn(c.E, c.E, generator=g) / c.E ** 0.5
    init["h_proj"] = torch.eye(c.E)
    init["enorm"] = torch.ones(c.E)
    init["hnorm"] = torch.ones(c.E)
    init["norm"] = r.tensor("output_norm.weight")
    init["hc_head_fn"] = r.tensor("output_hc_fn.weight")
    init["hc_head_base"] = r.tensor("output_hc_base.weight")
    init["hc_head_scale"] = r.tensor("output_hc_scale.weight")
    dev = torch.device(a.device)
    torch.backends.cuda.matmul.allow_tf32 = False  # the fixture is an f32 reference
    model = MTP(c, init).to(dev)
    emb, head = emb.to(dev), head.to(dev)

    texts = load_data(a.data, c.HC, c.E)
    n_held = max(1, len(texts) // 20)
    held, train = texts[:n_held], texts[n_held:]
    tr = chunks(train, a.seq)
    hd = chunks(held, a.seq)
    vocab = torch.unique(torch.cat([t for t, _ in texts]))
    remap = torch.full((head.shape[0],), -1, dtype=torch.long)
    remap[vocab] = torch.arange(vocab.shape[0])
    vocab, remap = vocab.to(dev), remap.to(dev)
    head_sub = head[vocab]
    print(f"data: {len(texts)} texts, {sum(t.shape[0] for t, _ in texts)} tokens, {len(tr)} train windows, "
          f"{len(hd)} held-out, softmax over {vocab.shape[0]} tokens", flush=True)

    def loss_acc(batch):
        h = torch.stack([b[0] for b in batch]).to(dev).float()
        xn = torch.stack([b[1] for b in batch]).to(dev)
        tgt = torch.stack([b[2] for b in batch]).to(dev)
        pos = torch.arange(h.shape[1], device=dev)
        y = model(h, emb[xn], pos)
        logits = y @ head_sub.t()
        t = torch.where(tgt >= 0, remap[tgt.clamp(min=0)], torch.full_like(tgt, -100))
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), t.reshape(-1), ignore_index=-100)
        m = t >= 0
        acc = ((logits.argmax(-1) == t) & m).sum().item() / max(1, m.sum().item())
        return loss, acc

    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.0)
    log = {"args": vars(a), "steps": []}
    t0 = time.time()
    order = torch.randperm(len(tr), generator=g)
    at = 0
    for step in range(a.steps):
        if at + a.batch > len(tr):
            order, at = torch.randperm(len(tr), generator=g), 0
        batch = [tr[i] for i in order[at:at + a.batch].tolist()]
        at += a.batch
        lr = a.lr * min(1.0, (step + 1) / 20) * 0.5 * (1 + torch.cos(torch.tensor(step / a.steps * 3.14159265)).item())
        for pg in opt.param_groups:
            pg["lr"] = lr
        loss, acc = loss_acc(batch)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 20 == 0 or step == a.steps - 1:
            print(f"step {step} loss {loss.item():.4f} top1 {acc:.3f} {time.time() - t0:.0f}s", flush=True)
            log["steps"].append({"step": step, "loss": loss.item(), "top1": acc})
        if a.time_limit and time.time() - t0 > a.time_limit:
            print(f"time limit at step {step}", flush=True)
            break
    with torch.no_grad():
        ls, accs = [], []
        for i in range(0, len(hd), a.batch):
            l, ac = loss_acc(hd[i:i + a.batch])
            ls.append(l.item())
            accs.append(ac)
    log["heldout_loss"] = sum(ls) / len(ls)
    log["heldout_top1"] = sum(accs) / len(accs)
    log["train_seconds"] = time.time() - t0
    print(f"held-out: loss {log['heldout_loss']:.4f}, top-1 {log['heldout_top1']:.3f} (next-next token)", flush=True)

    tensors = [(gguf_name(n), getattr(model, n).cpu()) for n in NAMES + OWN + ["exp_probs_b"]]
    gguf_io.write(a.out, tensors, {"general.architecture": "deepseek4", "general.name": "demo-mtp",
                                   "deepseek4.nextn_predict_layers": 1})
    with open(os.path.splitext(a.out)[0] + ".train-log.json", "w") as f:
        json.dump(log, f, indent=1)
    print("saved", a.out, flush=True)

    if a.fixture:
        # reference: the first held-out text's first 40 MTP positions from
        # position 0, full-vocabulary logits of the last 3 rows
        toks, h = held[0]
        n = min(40, toks.shape[0] - 1)
        with torch.no_grad():
            y = model(h[None, :n].to(dev).float(), emb[toks[1:n + 1].to(dev)][None], torch.arange(n, device=dev))
            logits = (y[0, n - 3:] @ head.t()).contiguous().cpu()
        os.makedirs(a.fixture, exist_ok=True)
        open(os.path.join(a.fixture, "hidden.f32"), "wb").write(h[:n].float().contiguous().numpy().tobytes())
        open(os.path.join(a.fixture, "tokens.i32"), "wb").write(struct.pack("<%di" % n, *toks[1:n + 1].tolist()))
        open(os.path.join(a.fixture, "logits.f32"), "wb").write(logits.numpy().tobytes())
        json.dump({"rows": n, "logit_rows": [n - 3, n - 2, n - 1], "n_vocab": int(head.shape[0]),
                   "made_by": "tools/train_demo/train_mtp.py (mtp_torch.py), torch " + torch.__version__},
                  open(os.path.join(a.fixture, "manifest.json"), "w"), indent=1)
        print("fixture", a.fixture, flush=True)


if __name__ == "__main__":
    main()
