"""SillyTavern as it ships: every text-completion preset of its current release, and its
default settings, sent as its own request builder sends them for each API type it offers
for a local server, with "Multiple swipes per generation" at 3, streamed and not; and its
Chat Completion's message list on both bundled models.

The release is the npm package `sillytavern` (1.19.0), which `make test` downloads once into
~/.cache/llama-srb (the Makefile's `sillytavern` step); outside `make test` these tests skip
when it is not there. From it:
- default/content/presets/textgen/*.json and default/content/settings.json: the settings;
- public/scripts/textgen-settings.js: getTextGenGenerationData (createTextGenGenerationData)
  builds each body, run in node as it ships (sillytavern/request.mjs says how the settings
  are put together: loadTextGenSettings, selectPreset, the #textgen_type handler's Top K -1);
- src/constants.js: VLLM_KEYS and OPENAI_KEYS, with which
  src/endpoints/backends/text-completions.js (/generate) filters the vLLM and Generic
  bodies before forwarding them (Generic: stop[:4]) to /completion (llama.cpp) or
  /v1/completions (the others);
- public/script.js (extractMessageFromData, extractMultiSwipes) and sse-stream.js read
  the answers (tests/integration/st_client.py);
- public/scripts/openai.js and default/content/settings.json's oai_settings: the Chat
  Completion prompts.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.bundled import GEMMA
from tests.integration.st_client import TIMEOUT, st_textgen_stream, st_textgen_whole
from tests.support.server import RunningServer

VERSION = "1.19.0"
PACKAGE = Path(
    os.environ.get("LLAMA_SRB_SILLYTAVERN")
    or Path.home() / ".cache" / "llama-srb" / f"sillytavern-{VERSION}" / "package"
)
REQUEST_JS = Path(__file__).parent / "sillytavern" / "request.mjs"
PRESETS = PACKAGE / "default" / "content" / "presets" / "textgen"
SETTINGS = PACKAGE / "default" / "content" / "settings.json"
# The API types ST offers for a server of one's own (textgen-settings.js SERVER_INPUTS,
# less Ollama and Hugging Face's, which speak other APIs).
TYPES = ["llamacpp", "vllm", "aphrodite", "tabby", "ooba", "koboldcpp", "generic"]
SENDS_N = {"llamacpp", "vllm", "aphrodite", "tabby"}  # textgen-settings.js canMultiSwipe
N = 3
STORY = (
    "Mira pushed open the door of the abandoned observatory. Dust swirled in the moonlight,"
    " and on the great brass telescope someone had left a note. It read:"
)


def _package() -> Path:
    if not (PRESETS.is_dir() and SETTINGS.is_file()):
        message = f"SillyTavern {VERSION} is not unpacked at {PACKAGE}: `make sillytavern`"
        if os.environ.get("LLAMA_SRB_SILLYTAVERN"):  # make test sets it: it must be there
            pytest.fail(message)
        pytest.skip(message + " (make test does it)")
    if shutil.which("node") is None:
        pytest.skip("needs node to run SillyTavern's request builder")
    return PACKAGE


def preset_names() -> list[str]:
    names = sorted(p.stem for p in PRESETS.glob("*.json")) if PRESETS.is_dir() else []
    return ["(default settings)", *names]


@cache
def built(server_url: str, model: str) -> dict[str, Any]:
    """Every (type, preset) body, built by SillyTavern's code in one node run."""
    package = _package()
    cases = [
        {
            "type": api_type,
            "preset": None
            if name.startswith("(")
            else json.loads((PRESETS / f"{name}.json").read_text()),
            "n": N,
            "maxTokens": 16,
            "stop": ["\nMira:"],
            "prompt": STORY,
            "serverUrl": server_url,
            "model": model,
        }
        for api_type in TYPES
        for name in preset_names()
    ]
    out = subprocess.run(
        ["node", str(REQUEST_JS), str(package)],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    result = json.loads(out.stdout)
    bodies = iter(result["bodies"])
    return {
        "bodies": {(t, n): next(bodies) for t in TYPES for n in preset_names()},
        "VLLM_KEYS": set(result["VLLM_KEYS"]),
        "OPENAI_KEYS": set(result["OPENAI_KEYS"]),
    }


def forwarded(server: RunningServer, api_type: str, preset: str) -> dict[str, Any]:
    """The body as SillyTavern's server forwards it (text-completions.js /generate)."""
    made = built(server.base_url + "/v1", server.model_id)
    body = dict(made["bodies"][(api_type, preset)])
    if api_type == "vllm":
        body = {k: v for k, v in body.items() if k in made["VLLM_KEYS"]}
    if api_type == "generic":
        body = {k: v for k, v in body.items() if k in made["OPENAI_KEYS"]}
        body["stop"] = body["stop"][:4]
    return body


def greedy(body: dict[str, Any]) -> bool:
    """The Deterministic preset: every swipe is the same text, as it should be."""
    return body.get("temperature") == 0 or body.get("top_k") == 1


@pytest.mark.models(GEMMA)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("preset", preset_names())
@pytest.mark.parametrize("api_type", TYPES)
def test_every_preset_for_every_api_type(
    server: RunningServer, api_type: str, preset: str, stream: bool
) -> None:
    """200, the reply and its swipes (n=3 for the types ST sends `n` to, none for the
    others), each a text, all different unless the preset is greedy. The default model
    only: these are the request's fields, which mean the same to either model."""
    # SillyTavern's Seed setting (-1, unseeded, as shipped) set: an unseeded Neutral draw
    # (every token) once ended a swipe at its first token, an empty text, on CI.
    body = {**forwarded(server, api_type, preset), "seed": 11}
    read = st_textgen_stream if stream else st_textgen_whole
    got = read(api_type, server, body)
    texts = [got["text"], *got["swipes"]]
    assert len(texts) == (N if api_type in SENDS_N else 1), got
    assert all(isinstance(t, str) and t for t in texts), texts
    assert "undefined" not in texts  # sse-stream's `+=` of a missing text
    if len(texts) > 1:
        assert len(set(texts)) == (1 if greedy(body) else N), texts


def test_what_sillytavern_sends_that_other_servers_read_as_off(server: RunningServer) -> None:
    """The presets send top_k -1 to vLLM and Aphrodite (their "off") and sampler names
    llama.cpp skips to the llama.cpp type: the settings as shipped, read from the package."""
    made = built(server.base_url + "/v1", server.model_id)["bodies"]
    default = preset_names()[0]
    assert made[("vllm", default)]["top_k"] == made[("aphrodite", default)]["top_k"] == -1
    samplers = made[("llamacpp", default)]["samplers"]
    assert {"tfs_z", "typical_p"} <= set(samplers) and "typ_p" in samplers


# -- Chat Completion (Custom, OpenAI-compatible source) -------------------------------------


def chat_messages() -> list[dict[str, str]]:
    """What openai.js populateChatCompletion sends for a first reply with the shipped
    prompts (settings.json oai_settings.prompts, in its prompt_order): the main prompt and
    the character's fields as system messages, the greeting as the assistant, the user."""
    shipped = json.loads(SETTINGS.read_text())["oai_settings"]["prompts"]
    prompts = {p["identifier"]: p.get("content", "") for p in shipped}
    main = prompts["main"].replace("{{char}}", "Mira").replace("{{user}}", "User")
    return [
        {"role": "system", "content": main},
        {"role": "system", "content": "Mira is an astronomer who restores old observatories."},
        {"role": "system", "content": "[Start a new Chat]"},
        {"role": "assistant", "content": "*Mira looks up from the telescope.* Oh! A visitor?"},
        {"role": "user", "content": "What did the note say?"},
    ]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_chat_completion_with_sillytaverns_message_list(
    server: RunningServer, stream: bool
) -> None:
    """Both bundled models: Gemma 3's template takes the list folded (system messages
    joined into the first user turn, an empty user turn before the greeting), SmolLM2's
    ChatML one as sent; n=3 swipes either way (chat-completions.js forwards `n`)."""
    _package()
    body = {
        "messages": chat_messages(),
        "model": server.model_id,
        "temperature": 1,
        "max_tokens": 16,
        "stream": stream,
        "presence_penalty": 0,
        "frequency_penalty": 0,
        "top_p": 1,
        "n": N,
    }
    url = f"{server.api_url}/chat/completions"
    if not stream:
        response = httpx.post(url, json=body, timeout=TIMEOUT)
        assert response.status_code == 200, response.text
        texts = [c["message"]["content"] for c in response.json()["choices"]]
    else:
        parts: dict[int, str] = {}
        with httpx.stream("POST", url, json=body, timeout=TIMEOUT) as response:
            assert response.status_code == 200, response.read()
            for line in response.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    choice = json.loads(line[6:])["choices"][0]
                    index = choice["index"]
                    parts[index] = parts.get(index, "") + (choice["delta"].get("content") or "")
        texts = [parts[i] for i in sorted(parts)]
    assert len(texts) == N and all(texts), texts
