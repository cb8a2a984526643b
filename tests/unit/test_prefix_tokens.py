"""PrefixTokenizer over fake tokenizers: a reused start always gives the tokens a full
tokenization gives, and a tokenizer whose split would change them is caught."""

from __future__ import annotations

import random
import re

from llama_srb.prefix_tokens import MIN_BYTES, PrefixTokenizer

BOS = 0


class WordTokenizer:
    """One token per word with its leading spaces; newlines alone (like SentencePiece);
    `<eot>` a control token once the test gives it an id."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.pieces: dict[int, bytes] = {BOS: b""}
        self.calls: list[int] = []  # bytes read per call

    def __call__(self, text: str, add_special: bool) -> list[int]:
        self.calls.append(len(text.encode()))
        tokens = [BOS] if add_special else []
        for word in re.findall(r"<eot>|\n| *(?:(?!<eot>)[^ \n])+| +", text):
            tokens.append(self.ids.setdefault(word, len(self.ids) + 1))
            self.pieces.setdefault(self.ids[word], word.encode())
        return tokens

    def piece(self, token: int) -> bytes:
        return self.pieces[token]


def story(rng: random.Random, words: int) -> str:
    vocab = ["the", "lamp", "sea", "Mara", "wrote", "night", "é", "boat", "kept", "light"]
    parts = []
    for _ in range(words):
        parts.append(rng.choice(vocab))
        parts.append(rng.choice([" ", " ", " ", "  ", "\n", ". "]))
    return "".join(parts)


def test_a_continued_story_tokenizes_only_its_end() -> None:
    words = WordTokenizer()
    tokenize = PrefixTokenizer(words, words.piece, add_special=True)
    text = story(random.Random(0), 4000)
    assert tokenize(text) == words(text, True)
    longer = text + " and the sea kept the light"
    words.calls.clear()
    assert tokenize(longer) == words(longer, True)
    assert tokenize.reused == 1
    assert words.calls[0] < 1024  # the reuse read a few hundred bytes, not the story


def test_any_edit_gives_the_full_tokenization() -> None:
    rng = random.Random(1)
    words = WordTokenizer()
    tokenize = PrefixTokenizer(words, words.piece, add_special=True)
    texts = [story(rng, 3000)]
    for _ in range(300):
        base = rng.choice(texts)
        at = rng.randrange(len(base) - rng.choice([1, 10, 200, 3000]), len(base))
        edited = base[:at] + rng.choice(["", " x", "\n\n", "yz", story(rng, 20)])
        edited += base[at + rng.choice([0, 0, 1, 5]) :] if rng.random() < 0.3 else ""
        assert tokenize(edited) == words(edited, True), at
        texts.append(edited)
    assert tokenize.reused > 100


def test_a_tokenizer_that_splits_differently_at_a_text_start_is_caught() -> None:
    """When a text's first word tokenizes unlike the same word in context, every reuse is
    refused by the check and the answer is still the full tokenization."""
    words = WordTokenizer()

    def spelled_start(text: str, add_special: bool) -> list[int]:
        tokens = words(text, add_special)
        if add_special or not tokens:
            return tokens
        return words(" ".join(words.piece(tokens[0]).decode()), False) + tokens[1:]

    tokenize = PrefixTokenizer(spelled_start, words.piece, add_special=True)
    text = story(random.Random(2), 4000)
    for extra in [" a", " bb", " ccc", "\nd"]:
        text += extra
        assert tokenize(text) == words(text, True)
    assert tokenize.reused == 0


def test_short_texts_and_control_tokens_are_tokenized_whole() -> None:
    words = WordTokenizer()
    tokenize = PrefixTokenizer(words, words.piece, add_special=True)
    short = "the lamp " * ((MIN_BYTES - 1) // 9)
    tokenize(short)
    assert tokenize(short + "x") == words(short + "x", True)
    # A control token has no bytes of its own: reading back over one stops the reuse.
    words.ids["<eot>"] = 999
    words.pieces[999] = b""
    text = story(random.Random(3), 4000) + "<eot> the end"
    tokenize(text)
    assert tokenize(text + " again") == words(text + " again", True)
    assert tokenize.reused == 0
