"""The GPU run's checks that need no real text (bench/gpu.sh), on a model of random weights:
what its text says is noise, so each check states a property any model must keep.

    python bench/gpu_checks.py --model MODEL.gguf [--cpu]

1. Offload: the build supports GPU offload and llama.cpp sees a GPU device (with --cpu, the
   dry run's CPU build: that it sees none, so the server runs every layer on the CPU).
2. Sampling paths: one request of n=4 through each sampler the server builds (greedy,
   seeded, top-k/top-p/min-p, typical, penalties, DRY, XTC, mirostat, logprobs), every branch
   exactly --tokens tokens (ignore_eos) and finished by length.
3. A grammar: n=4 under `root ::= "yes" | "no"`: every branch's text is one of the two.
4. The prefix cache: a ~600-token story, then the story with more words: the second
   request reads most of its prompt from the cache.
Checks 2-4 run on a server with `--backend-sampling off` and again on one with it `on`
(llama.cpp's top-k chain on each sequence, inside `llama_decode`), and then:
5. Backend sampling: with it on, rows were read as the device's candidates (the
   `llama_srb_backend_sampling_rows` counter; the bytes of logits read per token are
   reported: the sampler settings of check 2 mostly take the host path); greedy text (n=4)
   is the same with it off and on: both read the argmax of the same row, ties to the
   lower id.
Prints one line per check and exits 1 if any fails.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.server import RunningServer, run_server

Body = dict[str, Any]
TIMEOUT = httpx.Timeout(120.0)
STORY = (
    "The lighthouse keeper counted the ships that passed each night and wrote their names "
    "in a book that nobody read, until the winter the harbour froze and a girl walked "
    "across the ice to ask him what the names meant. "
)
SAMPLERS: dict[str, Body] = {
    "greedy": {"temperature": 0},
    "seeded default": {"seed": 7},
    "top-k top-p min-p": {"top_k": 40, "top_p": 0.9, "min_p": 0.05, "temperature": 0.8},
    "typical": {"typical_p": 0.9},
    "penalties": {"repeat_penalty": 1.1, "presence_penalty": 0.5, "frequency_penalty": 0.5},
    "dry": {"dry_multiplier": 0.8, "dry_base": 1.75, "dry_allowed_length": 2},
    "xtc": {"xtc_probability": 0.5, "xtc_threshold": 0.1},
    "mirostat 2": {"mirostat": 2, "mirostat_tau": 5.0, "mirostat_eta": 0.1},
    "logprobs": {"n_probs": 5},
}


def offload(cpu: bool) -> str:
    import llama_cpp

    from llama_srb.native import has_gpu_device

    supports, device = bool(llama_cpp.llama_supports_gpu_offload()), bool(has_gpu_device())
    said = f"supports_gpu_offload={supports}, GPU device={device}"
    if cpu:  # (an RPC build says it supports offload: only the device tells)
        assert not device, f"a CPU build should see no GPU: {said}"
    else:
        assert supports and device, f"the CUDA build sees no GPU: {said}"
    return said


def sampling_paths(http: httpx.Client, base: str, tokens: int) -> str:
    for name, params in SAMPLERS.items():
        body = {"prompt": STORY, "n": 4, "n_predict": tokens, "ignore_eos": True, **params}
        response = http.post(f"{base}/completion", json=body)
        assert response.status_code == 200, f"{name}: {response.status_code} {response.text}"
        results = response.json()
        assert isinstance(results, list) and len(results) == 4, f"{name}: {results!r:.300}"
        for result in results:
            assert result["tokens_predicted"] == tokens, f"{name}: {result!r:.300}"
            assert result["stop_type"] == "limit", f"{name}: {result!r:.300}"
            if "n_probs" in params:
                assert result["completion_probabilities"], f"{name}: no probabilities"
    return f"{len(SAMPLERS)} sampler settings, n=4 x {tokens} tokens each"


def grammar(http: httpx.Client, base: str, _tokens: int) -> str:
    body = {
        "prompt": STORY + "Answer:",
        "n": 4,
        "max_tokens": 8,
        "grammar": 'root ::= "yes" | "no"',
    }
    response = http.post(f"{base}/v1/completions", json=body)
    assert response.status_code == 200, f"{response.status_code} {response.text}"
    texts = [choice["text"] for choice in response.json()["choices"]]
    assert len(texts) == 4 and set(texts) <= {"yes", "no"}, texts
    return f"4 branches under a grammar: {texts}"


def prefix_cache(http: httpx.Client, base: str, _tokens: int) -> str:
    story = STORY * 15

    def send(prompt: str) -> Body:
        body = {"prompt": prompt, "n": 2, "max_tokens": 4, "ignore_eos": True}
        response = http.post(f"{base}/v1/completions", json=body)
        assert response.status_code == 200, f"{response.status_code} {response.text}"
        return dict(response.json()["usage"])

    cold = send(story)
    warm = send(story + "She asked again the next night.")
    cached = int(warm["prompt_tokens_details"]["cached_tokens"])
    assert cached >= 0.9 * cold["prompt_tokens"], (cold, warm)
    return f"prompt {warm['prompt_tokens']} tokens, {cached} from the cache"


def greedy_text(http: httpx.Client, base: str, tokens: int) -> list[str]:
    body = {"prompt": STORY, "n": 4, "max_tokens": tokens, "temperature": 0, "ignore_eos": True}
    response = http.post(f"{base}/v1/completions", json=body)
    assert response.status_code == 200, f"{response.status_code} {response.text}"
    return [choice["text"] for choice in response.json()["choices"]]


def device_rows(server: RunningServer) -> str:
    """Rows were cut on the device; what the host read, per token, over every request."""
    samples = server.metrics()
    rows = {
        outcome: int(samples[f'llama_srb_backend_sampling_rows_total{{outcome="{outcome}"}}'])
        for outcome in ("candidates", "undecided", "decoded_again")
    }
    read = samples["llama_srb_logits_bytes_read_total"]
    drawn = samples["llama_srb_generated_tokens_total"]
    assert rows["candidates"] > 0, f"no row was read as the device's candidates: {rows}"
    return f"rows {rows}; {read / drawn:,.0f} bytes of logits read per token drawn"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a GGUF file (bench/make_model.py)")
    parser.add_argument("--cpu", action="store_true", help="the dry run: a CPU build")
    parser.add_argument("--tokens", type=int, default=16, help="per branch")
    args = parser.parse_args()
    failed = 0

    def check(name: str, fn: Callable[[], str]) -> None:
        nonlocal failed
        try:
            print(f"ok    {name}: {fn()}", flush=True)
        except AssertionError as exc:
            failed += 1
            print(f"FAIL  {name}: {exc}", flush=True)

    check("offload", lambda: offload(args.cpu))
    checks: dict[str, Callable[[httpx.Client, str, int], str]] = {
        "sampling paths": sampling_paths,
        "grammar": grammar,
        "prefix cache": prefix_cache,
    }
    greedy: dict[str, list[str]] = {}
    for mode in ("off", "on"):
        with (
            tempfile.TemporaryDirectory() as tmp,
            run_server(
                Path(tmp), "--model", args.model, "--n-ctx", "8192", "--backend-sampling", mode
            ) as server,
            httpx.Client(timeout=TIMEOUT) as http,
        ):
            for name, fn in checks.items():
                check(
                    f"{name}, backend sampling {mode}",
                    partial(fn, http, server.base_url, args.tokens),
                )
            greedy[mode] = greedy_text(http, server.base_url, args.tokens)
            if mode == "on":
                check("backend sampling on: device rows", lambda: device_rows(server))
            else:
                log_tail(server)

    def same_greedy() -> str:
        assert greedy["on"] == greedy["off"], greedy
        return f"n=4 x {args.tokens} tokens, the same text with it off and on"

    check("backend sampling: greedy", same_greedy)
    sys.exit(1 if failed else 0)


def log_tail(server: RunningServer) -> None:
    """The lines of the server's log that say where the layers went."""
    for line in server.log_path.read_text(errors="replace").splitlines():
        if "offload" in line.lower() or "CUDA" in line:
            print(f"      log: {line.strip()[:160]}")


if __name__ == "__main__":
    main()
