"""The two other APIs agents speak, each asked by its official Python package against
`llm-rs serve`: OpenAI's Responses API (`openai`) and Anthropic's Messages API (`anthropic`) —
text, calls held to a named tool, streamed with each SDK's own accumulating helper, an agent
loop (with kept responses too), token counting, and the errors of what cannot be done. Run by tests/server.rs as
`python apis_client.py BASE_URL`; exits non-zero on the first failed check."""

import json
import sys

import anthropic
import openai

base = sys.argv[1]

oa = openai.OpenAI(base_url=base + "/v1", api_key="not-needed", max_retries=0, timeout=120)
an = anthropic.Anthropic(base_url=base, api_key="not-needed", max_retries=0, timeout=120)
model = oa.models.list().data[0].id

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 24},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city"],
    "additionalProperties": False,
}


def weather_args(args):
    """Arguments (a dict) that hold to SCHEMA."""
    assert isinstance(args, dict) and set(args) <= {"city", "unit"}, args
    assert isinstance(args["city"], str) and len(args["city"]) <= 24, args
    assert args.get("unit", "celsius") in ("celsius", "fahrenheit"), args
    return args


ASK = "What is the weather in Paris?"

# ---- OpenAI's Responses API -------------------------------------------------------------
FN = {"type": "function", "name": "get_weather", "description": "The current weather in a city.",
      "parameters": SCHEMA}

# 1. Text: output_text, the usage, and a status that says why it ended. The model's greeting is
#    longer than 8 tokens: cut short, the response is incomplete for want of output tokens.
r = oa.responses.create(model=model, input="Say hello.", instructions="Be brief.",
                        max_output_tokens=8, temperature=0)
assert r.object == "response" and r.model == model, r
assert r.output_text and r.output[0].type == "message", r.output
assert r.usage.input_tokens > 0 and r.usage.output_tokens == 8, r.usage
assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens, r.usage
assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens", r
print("responses text:", r.status, repr(r.output_text))

# 2. A named function: one function_call item whose arguments hold to the schema.
r = oa.responses.create(model=model, input=ASK, tools=[FN], max_output_tokens=96, temperature=0,
                        tool_choice={"type": "function", "name": "get_weather"})
calls = [o for o in r.output if o.type == "function_call"]
assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].call_id, r.output
city = weather_args(json.loads(calls[0].arguments))["city"]
print("responses call:", calls[0].arguments)

# 3. Streamed through the SDK's helper, which checks the events' order as it accumulates:
#    the arguments come in pieces, and the final response holds the whole call.
kinds, pieces = [], []
with oa.responses.stream(model=model, input=ASK, tools=[FN], max_output_tokens=96, temperature=0,
                         tool_choice="required") as stream:
    for event in stream:
        kinds.append(event.type)
        if event.type == "response.function_call_arguments.delta":
            pieces.append(event.delta)
    final = stream.get_final_response()
assert kinds[0] == "response.created" and kinds[-1] == "response.completed", kinds
assert len(pieces) > 1, f"the arguments came in one piece: {pieces}"
call = [o for o in final.output if o.type == "function_call"][0]
assert call.arguments == "".join(pieces), (call.arguments, pieces)
weather_args(json.loads(call.arguments))
print("responses stream:", len(kinds), "events,", len(pieces), "pieces")

# 4. The agent loop: the streamed call and its output sent back as items; the answer is text.
output = {"type": "function_call_output", "call_id": call.call_id,
          "output": json.dumps({"city": city, "temperature": 21, "sky": "sunny"})}
items = [{"role": "user", "content": ASK},
         {"type": "function_call", "call_id": call.call_id, "name": "get_weather",
          "arguments": call.arguments},
         output]
r = oa.responses.create(model=model, input=items, tools=[FN], tool_choice="none",
                        max_output_tokens=32, temperature=0)
assert r.output_text and not [o for o in r.output if o.type == "function_call"], r.output
print("responses loop:", repr(r.output_text[:60]))

# 4b. The same loop going on from the kept response: only the output is sent, after the
#     response that made the call. The conversation is the same, so is the prompt and the
#     (greedy) answer.
k = oa.responses.create(model=model, previous_response_id=final.id, input=[output], tools=[FN],
                        tool_choice="none", max_output_tokens=32, temperature=0)
assert final.store and k.previous_response_id == final.id, (final.store, k)
assert k.usage.input_tokens == r.usage.input_tokens, (k.usage, r.usage)
assert k.output_text == r.output_text, (k.output_text, r.output_text)
print("responses kept:", k.usage.input_tokens, "input tokens, as sent whole")

# 5. A JSON Schema for the text (`text.format`), held by the grammar.
r = oa.responses.create(model=model, input="A city in France, as JSON.", max_output_tokens=64,
                        temperature=0, text={"format": {"type": "json_schema", "name": "place",
                                                        "schema": SCHEMA, "strict": True}})
weather_args(json.loads(r.output_text))
print("responses json:", r.output_text)

# 6. What cannot be done: a 400 naming the field — among it, going on from a response that
#    was never made or not kept.
unkept = oa.responses.create(model=model, input="Hi.", max_output_tokens=2, store=False)
assert unkept.store is False, unkept
for kwargs, param in [
    (dict(previous_response_id="resp_123"), "previous_response_id"),
    (dict(previous_response_id=unkept.id), "previous_response_id"),
    (dict(tools=[{"type": "web_search"}]), "tools"),
    (dict(input=[{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]), "input"),
]:
    try:
        oa.responses.create(model=model, **{"input": ASK, "max_output_tokens": 8, **kwargs})
        raise AssertionError(f"accepted: {param}")
    except openai.BadRequestError as e:
        assert e.status_code == 400 and e.param == param, (param, e.body)

# ---- Anthropic's Messages API -----------------------------------------------------------
# Anthropic's client no longer sends `temperature` (its newer models take none); this server
# reads it, sent as an extra field: greedy answers, the same each run.
GREEDY = {"extra_body": {"temperature": 0}}
TOOL = {"name": "get_weather", "description": "The current weather in a city.", "input_schema": SCHEMA}
ask = [{"role": "user", "content": ASK}]

# 7. Text cut short (stop_reason max_tokens), and count_tokens agreeing with the prompt the
#    answer read.
m = an.messages.create(model=model, max_tokens=8, system="Be brief.", **GREEDY,
                       messages=[{"role": "user", "content": "Say hello."}])
assert m.type == "message" and m.role == "assistant" and m.content[0].type == "text", m
assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 8 and m.model == model, m
read = m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)
counted = an.messages.count_tokens(model=model, system="Be brief.",
                                   messages=[{"role": "user", "content": "Say hello."}])
assert counted.input_tokens == read, (counted, m.usage)
m = an.messages.create(model=model, max_tokens=64, system="Be brief.", **GREEDY,
                       messages=[{"role": "user", "content": "Say hello."}])
assert m.stop_reason == "end_turn" and m.usage.output_tokens < 64, m
print("messages text:", repr(m.content[0].text[:40]), counted.input_tokens, "tokens")

# 8. A named tool: a tool_use block whose input holds to the schema, stop_reason tool_use.
m = an.messages.create(model=model, max_tokens=96, **GREEDY, messages=ask, tools=[TOOL],
                       tool_choice={"type": "tool", "name": "get_weather"})
uses = [b for b in m.content if b.type == "tool_use"]
assert m.stop_reason == "tool_use" and len(uses) == 1 and uses[0].name == "get_weather", m
weather_args(uses[0].input)
print("messages call:", uses[0].input)

# 9. Streamed through the SDK's helper, which accumulates input_json_delta pieces into the
#    block's input.
with an.messages.stream(model=model, max_tokens=96, **GREEDY, messages=ask, tools=[TOOL],
                        tool_choice={"type": "any"}) as stream:
    kinds = [e.type for e in stream]
    final = stream.get_final_message()
assert kinds[0] == "message_start" and kinds[-1] == "message_stop", kinds
assert kinds.count("content_block_delta") > 1, kinds
use = [b for b in final.content if b.type == "tool_use"][0]
weather_args(use.input)
assert final.stop_reason == "tool_use" and final.usage.output_tokens > 0, final
print("messages stream:", len(kinds), "events:", use.input)

# 10. The agent loop: the tool_use and its tool_result sent back; the answer is text.
loop = ask + [{"role": "assistant", "content": [b.model_dump() for b in m.content]},
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                            "content": json.dumps({"temperature": 21})}]}]
m = an.messages.create(model=model, max_tokens=32, **GREEDY, messages=loop, tools=[TOOL],
                       tool_choice={"type": "none"})
assert m.content and m.content[0].type == "text" and m.stop_reason != "tool_use", m
print("messages loop:", repr(m.content[0].text[:60]))

# 11. A JSON Schema for the answer (`output_config.format`), held by the grammar.
m = an.messages.create(model=model, max_tokens=64, **GREEDY, output_config={
    "format": {"type": "json_schema", "schema": SCHEMA}},
    messages=[{"role": "user", "content": "A city in France, as JSON."}])
weather_args(json.loads(m.content[0].text))
print("messages json:", m.content[0].text)

# 12. What cannot be done, in Anthropic's error shape.
for kwargs, error in [
    (dict(tools=[{"type": "web_search_20250305", "name": "web_search"}]), anthropic.BadRequestError),
    (dict(messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "base64",
        "media_type": "image/png", "data": "AA=="}}]}]), anthropic.BadRequestError),
    (dict(model="no-such-model"), anthropic.NotFoundError),
]:
    try:
        an.messages.create(**{"model": model, "max_tokens": 8, "messages": ask, **kwargs})
        raise AssertionError(f"accepted: {kwargs}")
    except error as e:
        assert e.body["type"] == "error" and e.body["error"]["message"], e.body
print("all checks passed")
