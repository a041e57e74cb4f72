#!/usr/bin/env python3
"""quality_collect.py - a ds4-quality manifest from an OpenAI-compatible
endpoint's answers, or from saved captures of the official API.

    scripts/quality_collect.py --url http://127.0.0.1:8000/v1 --model deepseek-v4-flash \
        --out OUT.json PROMPTS.jsonl [--max-tokens 32] [--top-logprobs 20] [--api-key KEY]
    scripts/quality_collect.py --out OUT.json --from-capture CAPTURE.official.json ...

PROMPTS.jsonl has one {"id", "prompt" | "messages"} object per line
(shared/data/ds4-vectors/quality-prompts.jsonl is one). Each prompt is sent
as one POST {url}/chat/completions with temperature 0, logprobs and
top_logprobs, thinking disabled (DeepSeek's "thinking" field; the prompt
the model sees is then <BOS><｜User｜>{prompt}<｜Assistant｜></think>, which
is how `ds4-quality score` renders the item), and the answer's
choices[0].logprobs.content becomes the item's steps: token text and bytes,
logprob, top_logprobs (docs/QUALITY.md, tools/quality_manifest.h). An
answer without logprobs is an error naming the prompt: without them there
is nothing to score against (`ds4-quality manifest` makes a manifest from
our own engine instead). Only the Python standard library is used.
"""
import argparse
import json
import os
import sys
import urllib.error
import urllib.request


def die(msg):
    print(f"quality_collect: {msg}", file=sys.stderr)
    sys.exit(1)


def token_obj(text, raw):
    """{"text", "bytes"}: the API's bytes when given, else the UTF-8 of the text."""
    if raw is None:
        if not isinstance(text, str):
            raise ValueError("token without text or bytes")
        raw = list(text.encode("utf-8"))
    if not isinstance(raw, list) or not raw or not all(isinstance(b, int) and 0 <= b <= 255 for b in raw):
        raise ValueError("bad token bytes")
    return {"text": text if isinstance(text, str) else "", "bytes": raw}


def steps_from_logprobs(content):
    steps = []
    for i, c in enumerate(content):
        tops = [{"token": token_obj(t.get("token"), t.get("bytes")), "logprob": float(t["logprob"])}
                for t in c.get("top_logprobs") or []]
        steps.append({"step": i, "token": token_obj(c.get("token"), c.get("bytes")),
                      "logprob": float(c["logprob"]), "top_logprobs": tops})
    return steps


def read_prompts(path):
    items = []
    try:
        lines = open(path, encoding="utf-8").read().splitlines()
    except OSError as e:
        die(f"cannot read {path}: {e.strerror}")
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            j = json.loads(line)
        except json.JSONDecodeError as e:
            die(f"{path} line {no}: malformed JSON: {e.msg}")
        if not isinstance(j, dict) or not isinstance(j.get("id"), str):
            die(f"{path} line {no}: expected an object with a string \"id\"")
        if isinstance(j.get("messages"), list) and j["messages"]:
            msgs = j["messages"]
        elif isinstance(j.get("prompt"), str):
            msgs = [{"role": "user", "content": j["prompt"]}]
        else:
            die(f"{path} line {no}: needs \"prompt\" (string) or \"messages\" (non-empty array)")
        items.append((j["id"], msgs))
    if not items:
        die(f"{path} has no prompts")
    return items


def ask(url, key, model, msgs, max_tokens, top, cid):
    body = {"model": model, "messages": msgs, "temperature": 0, "max_tokens": max_tokens,
            "logprobs": True, "top_logprobs": top, "thinking": {"type": "disabled"}, "stream": False}
    req = urllib.request.Request(url.rstrip("/") + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json",
                                          **({"authorization": f"Bearer {key}"} if key else {})})
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            ans = json.load(r)
    except urllib.error.HTTPError as e:
        die(f"{cid}: HTTP {e.code} from {url}: {e.read()[:300].decode('utf-8', 'replace')}")
    except (urllib.error.URLError, OSError) as e:
        die(f"{cid}: cannot reach {url}: {e}")
    except json.JSONDecodeError:
        die(f"{cid}: the answer from {url} is not JSON")
    try:
        choice = ans["choices"][0]
    except (KeyError, IndexError, TypeError):
        die(f"{cid}: the answer has no choices[0]")
    lp = choice.get("logprobs")
    content = lp.get("content") if isinstance(lp, dict) else None
    if not content:
        die(f"{cid}: the endpoint returned no logprobs (choices[0].logprobs is {json.dumps(lp)}); it must implement "
            "logprobs/top_logprobs, or make the manifest with `ds4-quality manifest` from a local model")
    try:
        return steps_from_logprobs(content)
    except (KeyError, TypeError, ValueError) as e:
        die(f"{cid}: malformed logprobs in the answer ({e})")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url")
    ap.add_argument("--model", default="deepseek-v4-flash")
    ap.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY") or os.environ.get("DEEPSEEK_API_KEY"))
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--top-logprobs", type=int, default=20)
    ap.add_argument("--from-capture", nargs="+", metavar="CAPTURE")
    ap.add_argument("--out", required=True, metavar="OUT.json")
    ap.add_argument("prompts", nargs="?", metavar="PROMPTS.jsonl")
    a = ap.parse_args()
    items = []
    if a.from_capture:
        if a.prompts:
            ap.error("--from-capture takes no PROMPTS.jsonl")
        for path in a.from_capture:
            try:
                c = json.load(open(path, encoding="utf-8"))
                if c.get("schema") != "ds4-official-logprobs-v1":
                    die(f"{path}: not an official API capture (schema ds4-official-logprobs-v1)")
                msgs = c["request"]["messages"]
                thinking = (c["request"].get("thinking") or {}).get("type") != "disabled"
                steps = [{"step": s["step"], "token": token_obj(s["token"]["text"], s["token"].get("bytes")),
                          "logprob": float(s["logprob"]),
                          "top_logprobs": [{"token": token_obj(t["token"]["text"], t["token"].get("bytes")),
                                            "logprob": float(t["logprob"])} for t in s.get("top_logprobs", [])]}
                         for s in c["steps"]]
            except OSError as e:
                die(f"cannot read {path}: {e.strerror}")
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                die(f"{path}: malformed capture ({e})")
            items.append({"id": c.get("id", os.path.basename(path)), "messages": msgs, "thinking": thinking,
                          "steps": steps})
        source, model, top = "official API captures", "deepseek-v4-flash", 20
    else:
        if not a.url or not a.prompts:
            ap.error("give --url URL and PROMPTS.jsonl (or --from-capture)")
        if not 1 <= a.top_logprobs <= 20 or a.max_tokens < 1:
            ap.error("--top-logprobs must be 1..20 and --max-tokens >= 1")
        prompts = read_prompts(a.prompts)
        for i, (cid, msgs) in enumerate(prompts):
            items.append({"id": cid, "messages": msgs, "thinking": False,
                          "steps": ask(a.url, a.api_key, a.model, msgs, a.max_tokens, a.top_logprobs, cid)})
            print(f"\rquality_collect: {i + 1}/{len(prompts)} prompts", end="", file=sys.stderr)
        print(file=sys.stderr)
        source, model, top = a.url, a.model, a.top_logprobs
    doc = {"schema": "ds4-quality-manifest-v1", "source": source, "model": model, "top_k": top, "items": items}
    try:
        with open(a.out, "w", encoding="utf-8") as f:
            json.dump(doc, f, ensure_ascii=False)
    except OSError as e:
        die(f"cannot write {a.out}: {e.strerror}")
    print(f"quality_collect: {len(items)} items written to {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
