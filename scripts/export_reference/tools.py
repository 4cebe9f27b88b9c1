"""Step 16: conversations with tools, rendered by llama-server's `/apply-template`.

Each template of llama.cpp's `models/templates` listed in TEMPLATES is given to llama-server
(`--jinja --chat-template-file`, the default model loaded for its vocabulary's BOS and EOS
texts), and each conversation of CASES is posted to `/apply-template`, which renders a request
exactly as `/v1/chat/completions` would before generating: the same message normalisation
(string arguments of earlier calls parsed into objects for templates that read them as objects,
null content made empty), the same `tools` and `chat_template_kwargs`. The template's text and
llama.cpp's prompt are written side by side; a case a template refuses is written with llama.cpp's
error. Chapter 19 renders the same conversations with its own code and must get the same text.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import tarfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from .common import log, sha256_file, write_json

# The templates: every tool-calling family the issue names that llama.cpp ships a template of
# (Qwen 2.5 and 3, Hermes 2 and 3, Llama 3.1-3.3, Mistral Nemo, DeepSeek R1, SmolLM3, QwQ),
# and the default model's own family (ChatML without tools).
TEMPLATES = [
    "Qwen-Qwen2.5-7B-Instruct",
    "Qwen-Qwen3-0.6B",
    "Qwen-QwQ-32B",
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use",
    "meta-llama-Llama-3.1-8B-Instruct",
    "meta-llama-Llama-3.2-3B-Instruct",
    "meta-llama-Llama-3.3-70B-Instruct",
    "mistralai-Mistral-Nemo-Instruct-2407",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B",
    "HuggingFaceTB-SmolLM3-3B",
]

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city's name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The local time in a time zone.",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string"}},
            "required": ["zone"],
        },
    },
}
# A fixed date for the templates that print one (Llama 3.x reads `date_string`), so that the
# prompts do not depend on the day they were made.
KWARGS = {"date_string": "26 Jul 2024"}


def call(id_, name, args):
    # Arguments as OpenAI clients send them: a JSON string.
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


CASES = {
    # The first turn of an agent: tools offered, the model about to answer.
    "offer": {
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the weather in Paris?"},
        ],
        "tools": [WEATHER, TIME],
    },
    # A call made, its result returned, the model about to answer again. Ids are nine
    # letters and digits, which Mistral's template requires.
    "result": {
        "messages": [
            {"role": "user", "content": "What is the weather in Paris?"},
            {"role": "assistant", "content": None,
             "tool_calls": [call("call00001", "get_weather", {"city": "Paris", "unit": "celsius"})]},
            {"role": "tool", "tool_call_id": "call00001", "content": "{\"temperature\": 21}"},
        ],
        "tools": [WEATHER, TIME],
    },
    # Two calls in one turn, two results, then the answer and a new question.
    "parallel": {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather and time in Tokyo?"},
            {"role": "assistant", "content": "",
             "tool_calls": [call("call00001", "get_weather", {"city": "Tokyo"}),
                            call("call00002", "get_time", {"zone": "Asia/Tokyo"})]},
            {"role": "tool", "tool_call_id": "call00001", "content": "Sunny, 25 C"},
            {"role": "tool", "tool_call_id": "call00002", "content": "14:05"},
            {"role": "assistant", "content": "Sunny and 25 C; it is 14:05."},
            {"role": "user", "content": "Thanks!"},
        ],
        "tools": [WEATHER, TIME],
    },
    # Markup a user typed: text, never a call (the template writes it as it is).
    "markup": {
        "messages": [
            {"role": "user",
             "content": "Print <tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>"},
        ],
        "tools": [TIME],
    },
    # No tools: the plain conversation, as chapter 2 renders it.
    "plain": {
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Hi!"},
        ],
    },
    # A template argument (Qwen3 and SmolLM3 read `enable_thinking`).
    "no_thinking": {
        "messages": [{"role": "user", "content": "What is 2+2?"}],
        "chat_template_kwargs": {"enable_thinking": False},
    },
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def render_all(server: Path, model: Path, template: Path) -> dict:
    """Every case rendered by one llama-server with `template`."""
    port = free_port()
    proc = subprocess.Popen(
        [str(server), "-m", str(model), "--jinja", "--chat-template-file", str(template),
         "--host", "127.0.0.1", "--port", str(port), "-c", "512", "-t", "2", "--no-webui"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"llama-server exited with {template.name}: {proc.stderr.read()[-2000:]}")
            try:
                with urllib.request.urlopen(base + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"llama-server did not start with {template.name}")
            time.sleep(0.2)
        out = {}
        for name, case in CASES.items():
            body = {**case, "chat_template_kwargs": {**KWARGS, **case.get("chat_template_kwargs", {})}}
            status, reply = post(base + "/apply-template", body)
            if status == 200:
                out[name] = {"prompt": reply["prompt"]}
            else:
                out[name] = {"error": reply.get("error", {}).get("message", str(reply))}
        return out
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def export_tools(root: Path, model: Path, sdist: Path, stage: Path) -> dict:
    """Write reference-data/tools/: the templates (copied) and `prompts.json`."""
    out = stage / "tools"
    (out / "templates").mkdir(parents=True)
    built = subprocess.run([str(root / "scripts" / "build-llama-server")], check=True,
                           capture_output=True, text=True).stdout.strip().splitlines()[-1]
    server = Path(built) / "llama-server"
    with tarfile.open(sdist) as tar:
        top = tar.getnames()[0].split("/")[0]
        for name in TEMPLATES:
            member = tar.extractfile(f"{top}/vendor/llama.cpp/models/templates/{name}.jinja")
            (out / "templates" / f"{name}.jinja").write_bytes(member.read())
    templates = {}
    for name in TEMPLATES:
        log(f"step 16: {name}")
        templates[name] = render_all(server, model, out / "templates" / f"{name}.jinja")
    write_json(out / "prompts.json", {
        "model": model.name,
        "chat_template_kwargs": KWARGS,
        "cases": CASES,
        "templates": templates,
    })
    rendered = sum(1 for t in templates.values() for c in t.values() if "prompt" in c)
    return {
        "templates": len(TEMPLATES),
        "cases": len(CASES),
        "rendered": rendered,
        "refused": len(TEMPLATES) * len(CASES) - rendered,
    }


def describe(rel: str) -> str | None:
    if rel == "tools/prompts.json":
        return ("conversations with tools (calls, results, parallel calls, markup, template "
                "arguments) and llama-server's /apply-template prompt for each, per template")
    if rel.startswith("tools/templates/"):
        return "a chat template from llama.cpp's models/templates, as the sdist vendors it"
    return None
