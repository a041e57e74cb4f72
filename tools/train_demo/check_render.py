"""Checks render.py against the official gold output 1 and the doc examples
that fall inside the subset it supports (run: python3 check_render.py DATA_DIR)."""
import json, os, sys
import render

d = sys.argv[1]
inp = json.load(open(os.path.join(d, "test_input_1.json")))
want = open(os.path.join(d, "test_output_1.txt"), encoding="utf-8").read()
msgs = []
for m in inp["messages"]:
    mm = {"role": m["role"], "content": m.get("content") or ""}
    if m.get("reasoning_content") is not None:
        mm["reasoning"] = m["reasoning_content"]
    if m.get("tool_calls"):
        mm["calls"] = [{"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}
                       for c in m["tool_calls"]]
    msgs.append(mm)
tools = [t["function"] for t in inp["tools"]]
got = render.render(msgs, thinking=True, tools=tools)
print("gold 1:", "OK" if got == want else "MISMATCH")
if got != want:
    for i, (a, b) in enumerate(zip(got, want)):
        if a != b:
            print(repr(got[max(0, i - 80):i + 80])); print(repr(want[max(0, i - 80):i + 80])); break
    sys.exit(1)
