"""Deterministic training data for the DwarfStar demo model.

Every example is a list of (text, trainable) segments (render.py) in the
exact DeepSeek V4 chat format: short factual answers (chat and thinking
mode, with brief reasoning), tool use with a few declared tools (DSML call,
tool result, final answer), and plain prose from a public-domain novel.

  python3 make_data.py PROSE.txt OUT.jsonl [--seed S]
"""
import argparse, json, random

import render

CAPITALS = {
    "France": "Paris", "Italy": "Rome", "Germany": "Berlin", "Spain": "Madrid", "Portugal": "Lisbon",
    "Japan": "Tokyo", "China": "Beijing", "India": "New Delhi", "Brazil": "Brasilia", "Canada": "Ottawa",
    "Australia": "Canberra", "Egypt": "Cairo", "Kenya": "Nairobi", "Mexico": "Mexico City",
    "Argentina": "Buenos Aires", "Russia": "Moscow", "Norway": "Oslo", "Sweden": "Stockholm",
    "Finland": "Helsinki", "Poland": "Warsaw", "Greece": "Athens", "Turkey": "Ankara",
    "Ireland": "Dublin", "Austria": "Vienna", "Switzerland": "Bern", "Netherlands": "Amsterdam",
    "Belgium": "Brussels", "Denmark": "Copenhagen", "Peru": "Lima", "Chile": "Santiago",
    "South Korea": "Seoul", "Thailand": "Bangkok", "Vietnam": "Hanoi", "Morocco": "Rabat",
    "Nigeria": "Abuja", "Hungary": "Budapest", "Czechia": "Prague", "Iceland": "Reykjavik",
    "United Kingdom": "London", "United States": "Washington",
}
OPPOSITES = {"hot": "cold", "big": "small", "fast": "slow", "day": "night", "up": "down",
             "happy": "sad", "light": "dark", "open": "closed", "early": "late", "young": "old"}
ANIMALS = {"dog": "barks", "cat": "meows", "cow": "moos", "duck": "quacks", "lion": "roars",
           "sheep": "bleats", "horse": "neighs", "owl": "hoots", "frog": "croaks", "bee": "buzzes"}
CITIES = ["Rome", "Paris", "Tokyo", "London", "Berlin", "Madrid", "Oslo", "Cairo", "Lima", "Milan",
          "Naples", "Boston", "Denver", "Sydney", "Seoul", "Dublin", "Vienna", "Prague"]
CONDITIONS = ["sunny", "cloudy", "rainy", "windy", "snowy", "foggy"]
SYSTEMS = ["", "You are a helpful assistant", "You are a helpful assistant.",
           "You are DwarfStar, a small helpful assistant."]

TOOLS = [
    {"name": "get_weather", "description": "Get the current weather for a city",
     "parameters": {"type": "object", "properties": {
         "location": {"type": "string", "description": "The city name"},
         "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Temperature unit"}},
         "required": ["location"]}},
    {"name": "add", "description": "Add two integers",
     "parameters": {"type": "object", "properties": {
         "a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}},
    {"name": "get_time", "description": "Get the current local time in a city",
     "parameters": {"type": "object", "properties": {
         "city": {"type": "string", "description": "The city name"}}, "required": ["city"]}},
]


def qa(rng):
    """One (question, reasoning, answer) triple."""
    k = rng.randrange(6)
    if k == 0:
        c = rng.choice(list(CAPITALS))
        q = rng.choice(["What is the capital of {}?", "What's the capital of {}?",
                        "Tell me the capital of {}.", "capital of {}?"]).format(c)
        return q, f"The user asks for the capital of {c}. It is {CAPITALS[c]}.", f"The capital of {c} is {CAPITALS[c]}."
    if k == 1:
        a, b = rng.randrange(0, 50), rng.randrange(0, 50)
        q = rng.choice(["What is {} + {}?", "How much is {} plus {}?", "Compute {} + {}."]).format(a, b)
        return q, f"{a} plus {b} makes {a + b}.", f"{a} + {b} = {a + b}."
    if k == 2:
        w = rng.choice(list(OPPOSITES))
        return (f"What is the opposite of \"{w}\"?", f"The opposite of {w} is {OPPOSITES[w]}.",
                f"The opposite of \"{w}\" is \"{OPPOSITES[w]}\".")
    if k == 3:
        a = rng.choice(list(ANIMALS))
        return f"What sound does a {a} make?", f"A {a} {ANIMALS[a]}.", f"A {a} {ANIMALS[a]}."
    if k == 4:
        q = rng.choice(["Hello!", "Hi", "Hello, who are you?", "Who are you?", "hi there"])
        return (q, "The user greets me. I should introduce myself briefly.",
                "Hello! I am DwarfStar's demo model, a tiny DeepSeek V4. How can I help you?")
    n = rng.randrange(1, 9)
    return (f"Count from 1 to {n}.", f"I list the numbers 1 through {n}.",
            ", ".join(str(i) for i in range(1, n + 1)) + ".")


def chat_example(rng):
    thinking = rng.random() < 0.5
    msgs = []
    sys_text = rng.choice(SYSTEMS)
    if sys_text:
        msgs.append({"role": "system", "content": sys_text})
    for _ in range(rng.choice([1, 1, 1, 2])):
        q, r, a = qa(rng)
        msgs.append({"role": "user", "content": q})
        msgs.append({"role": "assistant", "reasoning": r, "content": a})
    return render.render_segments(msgs, thinking)


def tool_example(rng):
    thinking = rng.random() < 0.5
    sys_text = rng.choice(SYSTEMS)
    msgs = [{"role": "system", "content": sys_text}]
    k = rng.randrange(3)
    if k == 0:
        city = rng.choice(CITIES)
        unit = rng.choice(["celsius", "fahrenheit"])
        temp = rng.randrange(-5, 35) if unit == "celsius" else rng.randrange(25, 95)
        cond = rng.choice(CONDITIONS)
        q = rng.choice(["What's the weather in {}?", "What is the weather like in {}?",
                        "Is it sunny in {}?", "Weather in {} please"]).format(city)
        if unit == "fahrenheit":
            q += " Use fahrenheit."
        args = {"location": city, "unit": unit}
        call_reason = f"The user wants the weather in {city}. I will call get_weather."
        result = json.dumps({"temperature": temp, "condition": cond})
        sym = "°C" if unit == "celsius" else "°F"
        answer = f"It is {cond} in {city}, with a temperature of {temp}{sym}."
        name = "get_weather"
    elif k == 1:
        a, b = rng.randrange(100, 10000), rng.randrange(100, 10000)
        q = rng.choice(["Use the add tool to sum {} and {}.", "What is {} + {}? Use the tool.",
                        "Please add {} and {}."]).format(a, b)
        args = {"a": a, "b": b}
        call_reason = f"I should call add with {a} and {b}."
        result = str(a + b)
        answer = f"{a} + {b} = {a + b}."
        name = "add"
    else:
        city = rng.choice(CITIES)
        hh, mm = rng.randrange(24), rng.randrange(60)
        q = rng.choice(["What time is it in {}?", "Current time in {}?", "Tell me the time in {}."]).format(city)
        args = {"city": city}
        call_reason = f"The user wants the local time in {city}. I will call get_time."
        result = json.dumps({"time": f"{hh:02d}:{mm:02d}"})
        answer = f"The local time in {city} is {hh:02d}:{mm:02d}."
        name = "get_time"
    msgs.append({"role": "user", "content": q})
    msgs.append({"role": "assistant", "reasoning": call_reason, "content": "",
                 "calls": [{"name": name, "arguments": args}]})
    msgs.append({"role": "tool", "content": result})
    msgs.append({"role": "assistant", "reasoning": "I have the tool result and can answer.", "content": answer})
    tools = rng.sample(TOOLS, len(TOOLS))[:rng.choice([1, 2, 3])]
    if not any(t["name"] == name for t in tools):
        tools.append(next(t for t in TOOLS if t["name"] == name))
    return render.render_segments(msgs, thinking, tools)


def prose_examples(text, rng, n, length=1500):
    out = []
    for _ in range(n):
        i = rng.randrange(0, max(1, len(text) - length))
        i = text.find(" ", i) + 1
        out.append([(render.BOS, False), (text[i:i + length], True)])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("prose")
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--chat", type=int, default=30000)
    ap.add_argument("--tools", type=int, default=15000)
    ap.add_argument("--prose-n", type=int, default=3000)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    text = open(a.prose, encoding="utf-8").read()
    ex = [chat_example(rng) for _ in range(a.chat)] + [tool_example(rng) for _ in range(a.tools)]
    ex += prose_examples(text, rng, a.prose_n)
    rng.shuffle(ex)
    with open(a.out, "w", encoding="utf-8") as f:
        for e in ex:
            f.write(json.dumps(e, ensure_ascii=False) + "\n")
    print(f"{len(ex)} examples -> {a.out}")


if __name__ == "__main__":
    main()
