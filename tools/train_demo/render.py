"""DeepSeek V4 prompt rendering (official encoding), the subset the demo
training data uses: system (+ tools), user, assistant (chat or thinking, with
DSML tool calls), tool results. Written from docs/dsv4-chat-format.md §3.

render_segments() returns [(text, trainable)] pieces whose boundaries all
fall on special tokens, so tokenizing the pieces one by one gives the same
ids as tokenizing the whole prompt; `trainable` marks what the model itself
emits (reasoning, content, DSML, EOS).
"""
import json

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
THINK, END_THINK = "<think>", "</think>"
DSML = "｜DSML｜"

TOOLS_HEAD = (
    "## Tools\n\nYou have access to a set of tools to help answer the user's question. "
    "You can invoke tools by writing a \"<｜DSML｜tool_calls>\" block like the following:\n\n"
    "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"$TOOL_NAME\">\n"
    "<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</｜DSML｜parameter>\n"
    "...\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"$TOOL_NAME2\">\n...\n</｜DSML｜invoke>\n"
    "</｜DSML｜tool_calls>\n\nString parameters should be specified as is and set `string=\"true\"`. "
    "For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set "
    "`string=\"false\"`.\n\nIf thinking_mode is enabled (triggered by <think>), you MUST output your "
    "complete reasoning inside <think>...</think> BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after </think> with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n")
TOOLS_TAIL = "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n"


def tools_block(tools):
    lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return TOOLS_HEAD + lines + TOOLS_TAIL


def dsml_calls(calls):
    invokes = []
    for c in calls:
        params = []
        for k, v in c["arguments"].items():
            if isinstance(v, str):
                params.append(f'<{DSML}parameter name="{k}" string="true">{v}</{DSML}parameter>')
            else:
                params.append(f'<{DSML}parameter name="{k}" string="false">{json.dumps(v, ensure_ascii=False)}</{DSML}parameter>')
        invokes.append(f'<{DSML}invoke name="{c["name"]}">\n' + "\n".join(params) + f"\n</{DSML}invoke>")
    return f"\n\n<{DSML}tool_calls>\n" + "\n".join(invokes) + f"\n</{DSML}tool_calls>"


def render_segments(messages, thinking, tools=None):
    """messages: dicts with role system|user|assistant|tool.
    assistant: content, optional reasoning, optional calls [{name, arguments}].
    tool: content. Consecutive tool messages merge into one user turn."""
    segs = [(BOS, False)]
    sys_msgs = [m for m in messages if m["role"] == "system"]
    system = sys_msgs[0]["content"] if sys_msgs else ("" if tools else None)
    if system is not None:
        segs.append((system + ("\n\n" + tools_block(tools) if tools else ""), False))
    rest = [m for m in messages if m["role"] != "system"]
    # Merge tool results into user turns (§3.1).
    turns = []
    for m in rest:
        if m["role"] == "tool":
            block = "<tool_result>" + m["content"] + "</tool_result>"
            if turns and turns[-1]["role"] == "user" and turns[-1].get("blocks"):
                turns[-1]["blocks"].append(block)
            else:
                turns.append({"role": "user", "blocks": [block]})
        elif m["role"] == "user":
            if turns and turns[-1]["role"] == "user":
                turns[-1]["blocks"].append(m["content"])
            else:
                turns.append({"role": "user", "blocks": [m["content"]]})
        else:
            turns.append(m)
    last_user = max(i for i, t in enumerate(turns) if t["role"] == "user")
    keep_all = bool(tools)  # tools declared: reasoning kept everywhere
    for i, t in enumerate(turns):
        if t["role"] == "user":
            segs.append((USER + "\n\n".join(t["blocks"]), False))
            if not thinking:
                tail = END_THINK
            else:
                tail = THINK if (keep_all or i >= last_user) else END_THINK
            segs.append((ASSISTANT + tail, False))
        else:
            text = ""
            if thinking and (keep_all or i > last_user):
                text += t.get("reasoning", "") + END_THINK
            text += t.get("content", "")
            if t.get("calls"):
                text += dsml_calls(t["calls"])
            # The model emits this part; historical turns before the last
            # user message are context, not targets.
            segs.append((text, i > last_user or keep_all))
            segs.append((EOS, i > last_user or keep_all))
    return segs


def render(messages, thinking, tools=None):
    return "".join(s for s, _ in render_segments(messages, thinking, tools))
