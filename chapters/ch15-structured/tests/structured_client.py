"""Structured output the way a user's program asks for it, with OpenAI's official Python
package: `chat.completions.parse` with a pydantic model (a strict `json_schema`), a
`json_object`, llama-server's `grammar` field, and the errors for what cannot be compiled.
Run by tests/server.rs as `python structured_client.py BASE_URL`; exits non-zero on the first
failed check."""

import json
import sys
from typing import Literal

import openai
import pydantic

base = sys.argv[1]

client = openai.OpenAI(base_url=base + "/v1", api_key="not-needed", max_retries=0, timeout=120)
model = client.models.list().data[0].id


class City(pydantic.BaseModel):
    name: str
    country: str
    population: int
    coastal: bool
    climate: Literal["arid", "temperate", "tropical", "polar"]


ask = [{"role": "user", "content": "Describe Paris as JSON."}]
for seed in range(3):
    r = client.chat.completions.parse(model=model, messages=ask, response_format=City,
                                      max_tokens=96, temperature=0.7, seed=seed)
    choice = r.choices[0]
    assert choice.finish_reason == "stop", choice
    city = choice.message.parsed
    assert isinstance(city, City), choice.message
    print("parse:", city)

r = client.chat.completions.create(model=model, messages=[
    {"role": "user", "content": "Give me a JSON object describing a dog."}],
    response_format={"type": "json_object"}, max_tokens=64, temperature=0)
text = r.choices[0].message.content
if r.choices[0].finish_reason == "stop":
    assert isinstance(json.loads(text), dict), text
print("json_object:", repr(text))

chunks = client.chat.completions.create(model=model, messages=ask, response_format={
    "type": "json_schema", "json_schema": {"name": "city", "strict": True,
                                           "schema": City.model_json_schema()}},
    max_tokens=96, temperature=0, stream=True)
streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
City.model_validate_json(streamed)
print("json_schema streamed:", streamed)

r = client.completions.create(model=model, prompt="Is water wet? Answer:", max_tokens=8,
                              temperature=0, extra_body={"grammar": 'root ::= " " ("yes" | "no")'})
assert r.choices[0].text in (" yes", " no"), r.choices[0]
assert r.choices[0].finish_reason == "stop", r.choices[0]
print("grammar:", repr(r.choices[0].text))

for body, field, words in [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "array", "items": {"type": "integer"}, "uniqueItems": True}}}},
     "response_format", "uniqueItems"),
    ({"extra_body": {"grammar": "root ::= root \"a\" | \"a\""}}, "grammar", "left-recursive"),
    ({"extra_body": {"grammar": "root ::= [a-z"}}, "grammar", "line 1, column"),
    ({"response_format": {"type": "xml"}}, "response_format", "json_schema"),
]:
    try:
        client.chat.completions.create(model=model, messages=ask, max_tokens=4, **body)
        raise AssertionError(f"{body}: accepted")
    except openai.BadRequestError as e:
        assert e.status_code == 400 and e.body["param"] == field, (body, e.body)
        assert words in e.body["message"], (words, e.body)
        print("refused:", e.body["message"])

print("all checks passed")
