"""Writes the texts an MTP block of the demo model learns from: the demo's
own generated conversations (make_data.py, a seed the main training did not
use), one text per example, separated by a line "<<<END>>>" (the format
ds4-mtp-data reads).

  python3 tools/train_demo/mtp_texts.py OUT.txt [N_CHAT N_TOOL] [SEED]
"""
import os, random, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_data  # noqa: E402


def main():
    out = sys.argv[1]
    n_chat = int(sys.argv[2]) if len(sys.argv) > 2 else 1500
    n_tool = int(sys.argv[3]) if len(sys.argv) > 3 else 700
    seed = int(sys.argv[4]) if len(sys.argv) > 4 else 2718
    rng = random.Random(seed)
    ex = [make_data.chat_example(rng) for _ in range(n_chat)] + [make_data.tool_example(rng) for _ in range(n_tool)]
    rng.shuffle(ex)
    with open(out, "w", encoding="utf-8") as f:
        for segs in ex:
            f.write("".join(t for t, _ in segs).replace("\n<<<END>>>\n", "\n<<<END >>>\n"))
            f.write("\n<<<END>>>\n")


if __name__ == "__main__":
    main()
