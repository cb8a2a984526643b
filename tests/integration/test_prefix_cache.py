"""The prefix cache with the real model: reuse is exact, and it really skips work."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.helpers import complete
from tests.integration.bundled import GEMMA, ModelFacts
from tests.support.paths import Step, assert_same_greedy, completion_steps
from tests.support.server import RunningServer, run_server

CHAPTER = (
    " Chapter one. The rain had not stopped for three days when Ilse found the letter under "
    "the floorboards of her grandmother's kitchen. The envelope was yellow and brittle, and "
    "the handwriting on it belonged to someone she had never met."
)


def story(words: int, title: str) -> str:
    """A prompt no other test sends (a title each), so nothing of it is cached yet. Fixed
    text, never random: what the tests compare is checked for near ties, which is a
    property of the prompt (tests/support/paths.py)."""
    # It stops inside the refrain, where the model is sure of what comes next; no trailing
    # space: clean token seams.
    return f"{title} story." + CHAPTER * words + " Chapter one"


def evaluated(server: RunningServer) -> float:
    return server.metric("llama_srb_prompt_tokens_evaluated_total")


def test_a_repeated_prompt_is_served_from_the_cache(server: RunningServer) -> None:
    prompt = story(4, "Repeated")
    greedy = {"max_tokens": 12, "temperature": 0, "ignore_eos": True, "logprobs": 2}
    cold = complete(server, prompt=prompt, **greedy)
    before = evaluated(server)
    warm = complete(server, prompt=prompt, **greedy)
    usage = warm["usage"]
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 0.95 * usage["prompt_tokens"]
    assert evaluated(server) - before == usage["prompt_tokens"] - cached
    assert_same_greedy(completion_steps(warm["choices"][0]), completion_steps(cold["choices"][0]))


def test_a_branch_reuses_the_prompt_and_the_chosen_continuation(server: RunningServer) -> None:
    prompt = story(3, "Branched")
    first = complete(server, prompt=prompt, n=3, max_tokens=16, seed=5, ignore_eos=True)
    chosen = first["choices"][1]["text"]
    branch_prompt = prompt + chosen + " Then"
    cold_tokens = first["usage"]["prompt_tokens"]
    branch = complete(server, prompt=branch_prompt, n=3, max_tokens=8, temperature=0)
    cached = branch["usage"]["prompt_tokens_details"]["cached_tokens"]
    # The whole first prompt and (but for a token at the seams) the chosen branch.
    assert cached >= cold_tokens + 16 - 3
    assert all(c["text"] for c in branch["choices"])


@pytest.mark.models(GEMMA)
def test_sliding_window_model_reuses_positions_beyond_the_window(server: RunningServer) -> None:
    """Gemma 3 attends over a 512-token window in most layers; with swa_full the cells
    far behind stay, so a cached 1,000-token prompt continues exactly like a cold one.
    Gemma 3 only: SmolLM2 has no sliding window (full attention keeps every cell), and
    the other tests here cover its reuse."""
    prompt = story(16, "Windowed")
    greedy = {"max_tokens": 16, "temperature": 0, "ignore_eos": True, "logprobs": 2}
    cold = complete(server, prompt=prompt, **greedy)
    assert cold["usage"]["prompt_tokens"] > 750
    warm = complete(server, prompt=prompt, **greedy)
    assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] > 750
    assert_same_greedy(completion_steps(warm["choices"][0]), completion_steps(cold["choices"][0]))
    # ...and a branch from deep inside the window continues like a cold run too.
    branch = prompt + cold["choices"][0]["text"]
    warm_branch = complete(server, prompt=branch, max_tokens=8, temperature=0, ignore_eos=True)
    branch_cached = warm_branch["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert branch_cached >= cold["usage"]["prompt_tokens"] + 10


def test_concurrent_requests_with_one_prompt_evaluate_it_once(server: RunningServer) -> None:
    prompt = story(6, "Concurrent")
    before = evaluated(server)
    with ThreadPoolExecutor(4) as pool:
        results = list(
            pool.map(lambda s: complete(server, prompt=prompt, max_tokens=4, seed=s), range(4))
        )
    prompt_tokens = results[0]["usage"]["prompt_tokens"]
    # Once in full, then at most the last token again per request (for its own logits).
    assert evaluated(server) - before <= prompt_tokens + 3 * 2
    assert sum(r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in results) >= 3 * (
        prompt_tokens - 2
    )


def test_a_story_longer_than_a_quarter_of_the_context_branches_for_free(
    server: RunningServer,
) -> None:
    """The cache may hold whatever running requests do not need, so a story longer than
    the old cache budget (2,048 cells at most) stays, branches and all."""
    prompt = story(48, "Longest")
    first = complete(server, prompt=prompt, n=2, max_tokens=16, seed=3, ignore_eos=True)
    story_tokens = first["usage"]["prompt_tokens"]
    assert story_tokens > 2048
    for choice in first["choices"]:  # continue either branch: only the seam is computed
        branch = complete(server, prompt=prompt + choice["text"], max_tokens=4)
        assert branch["usage"]["prompt_tokens_details"]["cached_tokens"] >= story_tokens + 10


def test_a_prompt_sharing_only_its_first_token_is_cached_on_its_second_try(
    server: RunningServer,
) -> None:
    complete(server, prompt=story(20, "Lengthy"), max_tokens=4)  # a long path is cached
    prompt = story(2, "Second")  # starts with BOS (where the model has one), then nothing in common
    first = complete(server, prompt=prompt, max_tokens=8)
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # no useless fork
    again = complete(server, prompt=prompt, max_tokens=8)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == (
        again["usage"]["prompt_tokens"] - 1
    )


def test_without_n_ctx_the_context_is_the_models_training_context(
    tmp_path_factory: pytest.TempPathFactory, bundled_model: str, model_facts: ModelFacts
) -> None:
    tmp = Path(tmp_path_factory.mktemp("auto"))
    with run_server(tmp, "--model", bundled_model) as running:
        assert running.metric("llama_srb_kv_cells_total") == model_facts.n_ctx_train
        assert f"n_ctx={model_facts.n_ctx_train}: the model's training context" in running.log()


@pytest.fixture(scope="module")
def tiny_cache_server(tmp_path_factory: pytest.TempPathFactory, bundled_model: str):  # type: ignore[no-untyped-def]
    with run_server(
        Path(tmp_path_factory.mktemp("tiny")),
        "--model",
        bundled_model,
        "--n-ctx",
        "2048",
        "--cache-cells",
        "300",
    ) as running:
        yield running


def counting(start: int) -> str:
    """A prompt (~130 tokens) whose greedy continuation has clear winners."""
    return f"Counting from {start}: " + ", ".join(str(k) for k in range(start, start + 20))


def test_eviction_under_a_tiny_cache_keeps_every_response_correct(
    tiny_cache_server: RunningServer,
) -> None:
    """The cache holds two of these paths: hits, misses and evictions all happen, and
    each prompt always gets the same text. (A prompt computed again after an eviction
    lands in other KV cells, which moves its logprobs a little: the counting has clear
    winners, checked at every step.)"""
    prompts = [counting(100 * (i + 1)) for i in range(4)]
    seen: dict[int, list[Step]] = {}
    for index in [0, 1, 0, 2, 0, 3, 1, 2, 0, 3]:
        out = complete(
            tiny_cache_server, prompt=prompts[index], n=2, max_tokens=8, temperature=0, logprobs=2
        )
        first, second = (completion_steps(c) for c in out["choices"])
        assert first == second  # one greedy branch, copied
        assert_same_greedy(seen.setdefault(index, first), first, at_least=8)
    assert tiny_cache_server.metric("llama_srb_prompt_tokens_cached_total") > 0
