"""What a real user's client does, with OpenAI's official Python package: models, chat and
completions, streaming and not, and the errors it raises. Run by tests/openai_client.rs as
`python openai_client.py BASE_URL`; exits non-zero on the first failed check."""

import sys

import openai

client = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="not-needed", max_retries=0, timeout=120)

model = client.models.list().data[0].id
assert model.startswith("SmolLM2"), model
print("models:", model)

messages = [{"role": "user", "content": "What is the capital of France?"}]
r = client.chat.completions.create(model=model, messages=messages, max_tokens=16, temperature=0)
answer = r.choices[0].message.content
assert answer and r.choices[0].finish_reason in ("stop", "length"), r
assert r.usage.completion_tokens <= 16 and r.usage.prompt_tokens > 0, r.usage
print("chat:", repr(answer))

chunks = list(client.chat.completions.create(
    model=model, messages=messages, max_tokens=16, temperature=0, stream=True,
    stream_options={"include_usage": True}))
streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
assert streamed == answer, (streamed, answer)
assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens, chunks[-1]
print("chat stream: same text,", len(chunks), "chunks")

r = client.completions.create(model=model, prompt="The capital of France is", max_tokens=8,
                              temperature=0, seed=1)
text = r.choices[0].text
assert text.startswith(" Paris"), text
assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 8, r
print("completion:", repr(text))

streamed = "".join(c.choices[0].text for c in client.completions.create(
    model=model, prompt="The capital of France is", max_tokens=8, temperature=0, stream=True))
assert streamed == text, (streamed, text)
print("completion stream: same text")

try:
    client.chat.completions.create(model="gpt-4o", messages=messages, max_tokens=1)
    sys.exit("an unknown model was accepted")
except openai.NotFoundError as e:
    assert e.status_code == 404 and "gpt-4o" in e.message, e
    print("unknown model: NotFoundError")

try:
    client.completions.create(model=model, prompt="word " * 3000, max_tokens=1)
    sys.exit("a prompt longer than the context was accepted")
except openai.BadRequestError as e:
    assert e.code == "context_length_exceeded", e
    print("too long: BadRequestError,", e.message)

try:
    client.chat.completions.create(model=model, messages=messages, top_p=1.5)
    sys.exit("top_p 1.5 was accepted")
except openai.BadRequestError as e:
    assert e.param == "top_p", e
    print("bad top_p: BadRequestError")
print("all checks passed")
