"""Evaluates the demo model with DwarfStar itself (greedy, ds4 CLI) on
held-out examples from the training distribution (a seed the training run
never used): exact match of the answer for short questions (chat and
thinking mode) and of the whole DSML tool call for tool prompts.

  python3 tools/train_demo/eval_demo.py [--model models/ds4-demo.gguf] [--ds4 ./ds4] [--n 60]

Prints one line per category and a summary; exit 0 (it measures, it does
not judge). Needs only Python 3 and the built ./ds4.
"""
import argparse, json, os, random, subprocess, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_data, render  # noqa: E402


def generate(ds4, model, prompt, n):
    with tempfile.TemporaryDirectory() as d:
        pf, out = os.path.join(d, "p.txt"), os.path.join(d, "lp.json")
        open(pf, "w", encoding="utf-8").write(prompt)
        subprocess.run([ds4, "-m", model, "--raw-prompt", "--prompt-file", pf, "-n", str(n),
                        "--dump-logprobs", out, "--logprobs-top-k", "1"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        steps = json.load(open(out, encoding="utf-8"))["steps"]
    text = b""
    for s in steps:
        if s["token"]["id"] == 1:  # EOS
            return text.decode("utf-8", "replace"), True
        text += bytes.fromhex(s["token"]["bytes"])
    return text.decode("utf-8", "replace"), False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/ds4-demo.gguf")
    ap.add_argument("--ds4", default="./ds4")
    ap.add_argument("--n", type=int, default=60, help="examples per category")
    ap.add_argument("--seed", type=int, default=4242)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    results = {}

    for thinking in (False, True):
        ok = 0
        for _ in range(a.n):
            q, r, ans = make_data.qa(rng)
            msgs = [{"role": "system", "content": "You are a helpful assistant"}, {"role": "user", "content": q}]
            prompt = render.render(msgs, thinking)
            out, eos = generate(a.ds4, a.model, prompt, 80)
            got = out.split(render.END_THINK, 1)[1] if thinking and render.END_THINK in out else out
            ok += int(eos and got == ans)
        results["answer exact match, " + ("thinking" if thinking else "chat")] = (ok, a.n)

    ok_name = ok_call = 0
    for _ in range(a.n):
        segs = make_data.tool_example(rng)
        # Prompt = everything up to the first assistant output; target = that output.
        prompt = "".join(t for t, tr in segs[:next(i for i, (_, tr) in enumerate(segs) if tr)])
        target = next(t for t, tr in segs if tr)
        out, eos = generate(a.ds4, a.model, prompt, 160)
        want_call = target[target.index("\n\n<" + render.DSML):]
        got_call = out[out.index("\n\n<" + render.DSML):] if ("\n\n<" + render.DSML) in out else ""
        name = want_call.split('name="', 1)[1].split('"', 1)[0]
        ok_name += int(f'invoke name="{name}"' in got_call)
        ok_call += int(eos and got_call == want_call)
    results["tool call: right tool name"] = (ok_name, a.n)
    results["tool call: whole DSML call exact"] = (ok_call, a.n)

    for k, (ok, n) in results.items():
        print(f"{k:40s} {ok:3d}/{n} = {100.0 * ok / n:.1f}%")


if __name__ == "__main__":
    main()
