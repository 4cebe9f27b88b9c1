"""Tool calls the way an agent asks for them, with OpenAI's official Python package against
`llm-rs serve`: calls held to `tool_choice` (required, a named function) streamed and not, an
agent loop (the model calls a tool, the client runs it and sends the result back, the model
answers), and the 400s of what cannot be done. Run by tests/server.rs as
`python tools_client.py BASE_URL`; exits non-zero on the first failed check."""

import json
import sys

import openai

base = sys.argv[1]

client = openai.OpenAI(base_url=base + "/v1", api_key="not-needed", max_retries=0, timeout=120)
model = client.models.list().data[0].id

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 24},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
ALARM = {
    "type": "function",
    "function": {
        "name": "set_alarm",
        "description": "Set an alarm.",
        "parameters": {
            "type": "object",
            "properties": {
                "hour": {"type": "integer", "minimum": 0, "maximum": 23},
                "minute": {"type": "integer", "minimum": 0, "maximum": 59},
                "confidence": {"type": "number", "minimum": 0, "maximum": 1},
            },
            "required": ["hour", "minute"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, ALARM]


def valid(name, arguments):
    """A call's arguments hold to its tool's schema (the checks these schemas need)."""
    args = json.loads(arguments)
    assert isinstance(args, dict), arguments
    if name == "get_weather":
        assert set(args) <= {"city", "unit"} and isinstance(args["city"], str), args
        assert len(args["city"]) <= 24 and args.get("unit", "celsius") in ("celsius", "fahrenheit"), args
    elif name == "set_alarm":
        assert set(args) <= {"hour", "minute", "confidence"}, args
        assert isinstance(args["hour"], int) and 0 <= args["hour"] <= 23, args
        assert isinstance(args["minute"], int) and 0 <= args["minute"] <= 59, args
        assert 0 <= args.get("confidence", 0) <= 1, args
    else:
        raise AssertionError(f"a call of {name}, which is not offered")
    return args


ask = [{"role": "user", "content": "What is the weather in Paris?"}]

# 1. `required`, not streamed: the turn is a call, finish_reason "tool_calls".
r = client.chat.completions.create(model=model, messages=ask, tools=TOOLS, tool_choice="required",
                                   max_tokens=96, temperature=0)
choice = r.choices[0]
assert choice.finish_reason == "tool_calls", choice
calls = choice.message.tool_calls
assert calls and len(calls) == 1, choice.message
assert calls[0].type == "function" and calls[0].id, calls[0]
valid(calls[0].function.name, calls[0].function.arguments)
print("required:", calls[0].function.name, calls[0].function.arguments)

# 2. A named function, streamed: the call's start (index, id, name), then its arguments piece
#    by piece; the pieces add up to JSON that holds to the schema.
stream = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Wake me up at 6:30."}], tools=TOOLS,
    tool_choice={"type": "function", "function": {"name": "set_alarm"}}, max_tokens=96,
    temperature=0.7, seed=3, stream=True)
started, pieces, finish = None, [], None
for chunk in stream:
    if not chunk.choices:
        continue
    c = chunk.choices[0]
    for d in c.delta.tool_calls or []:
        assert d.index == 0, d
        if d.id:
            assert started is None, "a second start of call 0"
            started = (d.id, d.function.name)
            assert d.function.arguments == "", d
        elif d.function and d.function.arguments:
            assert started, "arguments before the call's start"
            pieces.append(d.function.arguments)
    assert not c.delta.content, f"content beside a held call: {c.delta.content!r}"
    finish = c.finish_reason or finish
assert started and started[1] == "set_alarm", started
assert finish == "tool_calls", finish
assert len(pieces) > 1, f"the arguments came in one piece: {pieces}"
args = valid("set_alarm", "".join(pieces))
print("streamed:", started, len(pieces), "pieces:", args)

# 3. An agent loop: the model calls get_weather, the client runs it and answers with the
#    result, the model writes the answer (tools still offered, `none`: text only).
messages = list(ask)
r = client.chat.completions.create(model=model, messages=messages, tools=TOOLS,
                                   tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                   max_tokens=96, temperature=0)
call = r.choices[0].message.tool_calls[0]
city = valid(call.function.name, call.function.arguments)["city"]
messages.append(r.choices[0].message.model_dump(exclude_none=True))
messages.append({"role": "tool", "tool_call_id": call.id,
                 "content": json.dumps({"city": city, "temperature": 21, "sky": "sunny"})})
r = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, tool_choice="none",
                                   max_tokens=48, temperature=0)
answer = r.choices[0]
assert answer.finish_reason in ("stop", "length"), answer
assert not answer.message.tool_calls and answer.message.content, answer.message
print("agent loop:", city, "->", repr(answer.message.content[:60]))

# 4. `auto`: the model may answer in words or call; whatever it does parses.
r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi! How are you?"}],
                                   tools=TOOLS, max_tokens=48, temperature=0)
m = r.choices[0].message
for c in m.tool_calls or []:
    valid(c.function.name, c.function.arguments)
assert r.choices[0].finish_reason in ("stop", "length", "tool_calls"), r.choices[0]
print("auto:", r.choices[0].finish_reason, repr((m.content or "")[:40]), len(m.tool_calls or []))

# 5. What cannot be done is a 400 naming the field.
for kwargs, field in [
    (dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "launch"}}), "tool_choice"),
    (dict(tools=[{"type": "function", "function": {"name": "no spaces allowed"}}]), "tools"),
    (dict(tools=[WEATHER] * 2), "tools"),
    (dict(tools=[{"type": "function", "function": {"name": f"f{i}"}} for i in range(1000)]), "tools"),
    (dict(tool_choice="required"), "tool_choice"),
]:
    try:
        client.chat.completions.create(model=model, messages=ask, max_tokens=8, **kwargs)
        raise AssertionError(f"accepted: {field}")
    except openai.BadRequestError as e:
        assert e.status_code == 400 and field in str(e), (field, str(e))
# 6. A pydantic-style tool (its models in `$defs`, one referring to itself) held under
#    `required`; a megabyte description refused as more than the context holds.
TREE = {"type": "function", "function": {"name": "make_tree", "description": "A labelled tree.",
    "parameters": {"$defs": {"Node": {"type": "object", "properties": {
        "label": {"type": "string", "maxLength": 12},
        "kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}, "maxItems": 2}},
        "required": ["label"], "additionalProperties": False}},
        "type": "object", "properties": {"root": {"$ref": "#/$defs/Node"}}, "required": ["root"],
        "additionalProperties": False}}}
r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "A tree of fruits."}],
                                   tools=[TREE], tool_choice="required", max_tokens=128, temperature=0)
c = r.choices[0]
assert c.finish_reason == "tool_calls", c


def node(n, depth=0):
    assert isinstance(n, dict) and set(n) <= {"label", "kids"} and isinstance(n["label"], str), n
    assert len(n["label"]) <= 12 and len(n.get("kids", [])) <= 2 and depth < 50, n
    for k in n.get("kids", []):
        node(k, depth + 1)


node(json.loads(c.message.tool_calls[0].function.arguments)["root"])
print("pydantic-style:", c.message.tool_calls[0].function.arguments)
big = {"type": "function", "function": {"name": "big", "description": "x" * 1_000_000}}
try:
    client.chat.completions.create(model=model, messages=ask, tools=[big], max_tokens=8)
    raise AssertionError("a megabyte description accepted")
except openai.BadRequestError as e:
    assert e.status_code == 400 and e.param == "tools" and e.code == "context_length_exceeded", e.body
print("all checks passed")
