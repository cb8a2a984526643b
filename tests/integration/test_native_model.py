"""The bundled model through llama_srb.native, without a server: what the prefix cache and
the tokenizer's reuse rely on, checked against llama.cpp itself."""

from __future__ import annotations

import random
from collections.abc import Iterator

import llama_cpp as C
import pytest

from llama_srb.bundled_model import bundled_model_path
from llama_srb.native import Batch, Context, ContextOptions, Model
from tests.integration.bundled import GEMMA

SENTENCES = [
    "The lighthouse keeper climbed the hundred and twelve steps.",
    "Mara wrote one line in the logbook, as she had every night for thirty years.",
    "Outside, the gulls wheeled over the harbour — the boats were late.",
    "«Nobody comes here in winter», said the fisherman, and laughed.",
    "She trimmed the wick; the lamp turned, and turned, and turned.",
]


def story(rng: random.Random, sentences: int) -> str:
    parts = []
    for _ in range(sentences):
        parts.append(rng.choice(SENTENCES))
        parts.append(rng.choice([" ", " ", "\n", "\n\n"]))
    return "".join(parts)


@pytest.fixture(scope="module")
def model(bundled_model: str) -> Iterator[Model]:
    loaded = Model(bundled_model_path(bundled_model))
    yield loaded
    loaded.close()


def test_tokens_reused_from_a_kept_story_are_the_full_tokenization(model: Model) -> None:
    """The writer's loop (continue, branch, go back, edit the end) on long stories: every
    text tokenizes exactly as llama.cpp tokenizes it whole, and most reuse a kept start."""
    rng = random.Random(7)
    texts = [story(rng, 400)]
    for _ in range(60):
        base = rng.choice(texts)
        cut = len(base) - rng.choice([0, 0, 3, 40, 400])
        text = base[:cut] + rng.choice(["", " ", "\n\n"]) + story(rng, rng.randint(0, 3))
        assert model.tokenize(text) == model._tokenize(text, True, False), len(text)
        texts.append(text)
    memo = model._memos[(True, False)]
    assert memo.reused > 40


@pytest.mark.models(GEMMA)
def test_cells_of_a_sequence_stay_behind_its_sliding_window(model: Model) -> None:
    """Gemma 3 only: SmolLM2 has no sliding window. The prefix cache forks from deep inside cached paths, so it needs every position of a
    path, also those a sliding window (512 for Gemma 3) behind its end. llama.cpp's
    `find_slot` could hand such cells to another sequence when exactly one sequence holds
    them; this replays the case that would (a cached path, a freed one after it, then
    small chunks that make llama.cpp search from cell 0) and checks the path keeps its
    first position."""
    context = Context(model, ContextOptions(n_ctx=1024, n_seq_max=4, n_batch=512))
    batch = Batch(512)
    rng = random.Random(3)
    path = model.tokenize(story(rng, 80))[:700]  # its first 188 positions a window behind
    other = model.tokenize(story(rng, 40))[:250]
    assert len(path) == 700 and len(other) == 250

    def feed(seq: int, tokens: list[int], chunk: int) -> None:
        for start in range(0, len(tokens), chunk):
            batch.clear()
            batch.add_span(tokens[start : start + chunk], start, seq, True)
            context.decode(batch)

    try:
        feed(0, path, 512)
        feed(1, other, 512)
        context.seq_rm(1)
        feed(2, other, 32)
        assert C.llama_memory_seq_pos_min(context.memory, 0) == 0
        assert C.llama_memory_seq_pos_max(context.memory, 0) == len(path) - 1
    finally:
        batch.close()
        context.close()
