"""Other servers' field names and formats (api/schemas/dialects.py), the /completion result's stop
fields, the chat template choice, and `--n`: pure logic, no model."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import pytest
from pydantic import ValidationError

from llama_srb.api.input.chat import CHATML_STOPS, chat_params, choose, packaged
from llama_srb.api.input.params import logit_bias
from llama_srb.api.render.native import stop_info
from llama_srb.api.schemas import dialects
from llama_srb.api.schemas.chat import ChatRequest
from llama_srb.api.schemas.completions import CompletionRequest
from llama_srb.api.schemas.native import NativeCompletionRequest
from llama_srb.cli import add_settings_flags, settings_from_args
from llama_srb.engine.outputs import ChoiceSoFar
from llama_srb.engine.request import FinishReason
from llama_srb.sampling.params import ParamError, SamplingParams

# -- aliases ---------------------------------------------------------------------------------


def test_an_alias_becomes_its_canonical_field() -> None:
    out = dialects.canonical({"repetition_penalty": 1.2, "keep": 1}, dialects.SAMPLING_ALIASES)
    assert out == {"repeat_penalty": 1.2, "keep": 1}


def test_the_canonical_name_wins_over_an_alias() -> None:
    body = {"repeat_penalty": 1.1, "repetition_penalty": 1.5, "rep_pen": 1.7}
    assert dialects.canonical(body, dialects.SAMPLING_ALIASES) == {"repeat_penalty": 1.1}


def test_the_first_listed_alias_wins_and_null_is_absent() -> None:
    aliases = dialects.SAMPLING_ALIASES
    assert dialects.canonical({"rep_pen": 1.7, "repetition_penalty": 1.5}, aliases) == {
        "repeat_penalty": 1.5
    }
    assert dialects.canonical({"repeat_penalty": None, "rep_pen": 1.7}, aliases) == {
        "repeat_penalty": 1.7
    }
    assert dialects.canonical({"rep_pen": None}, aliases) == {}


def test_every_alias_names_a_field_of_its_request() -> None:
    for model, aliases in (
        (CompletionRequest, dialects.COMPLETION_ALIASES),
        (ChatRequest, dialects.CHAT_ALIASES),
        (NativeCompletionRequest, dialects.NATIVE_ALIASES),
    ):
        assert model.ALIASES is aliases
        for name, others in aliases.items():
            assert name in model.model_fields, (model.__name__, name)
            assert not set(others) & set(model.model_fields), (model.__name__, others)


def test_sillytavern_aliases_reach_the_request_fields() -> None:
    body = CompletionRequest.model_validate(
        {
            "prompt": "x",
            "max_new_tokens": 24,
            "rep_pen": 1.2,
            "repetition_penalty_range": 128,
            "typical": 0.9,
            "mirostat_mode": 2,
            "nsigma": 1.5,
            "ban_eos_token": True,
            "grammar_string": 'root ::= "a"',
            "sampler_seed": 5,
            "stopping_strings": ["\nUser:"],
            "min_length": 2,
            "n_probs": 3,
        }
    )
    assert (body.max_tokens, body.repeat_penalty, body.repeat_last_n) == (24, 1.2, 128)
    assert (body.typical_p, body.mirostat, body.top_n_sigma) == (0.9, 2, 1.5)
    assert (body.ignore_eos, body.grammar, body.seed) == (True, 'root ::= "a"', 5)
    assert (body.stop, body.min_tokens, body.logprobs) == (["\nUser:"], 2, 3)


def test_native_max_tokens_follow_llama_servers_order() -> None:
    both = {"prompt": "x", "n_predict": 5, "max_tokens": 9, "max_completion_tokens": 7}
    assert NativeCompletionRequest.model_validate(both).n_predict == 5
    del both["n_predict"]
    assert NativeCompletionRequest.model_validate(both).n_predict == 7
    body = NativeCompletionRequest.model_validate({"prompt": "x", "logprobs": 4, "n_cmpl": 2})
    assert (body.n_probs, body.n) == (4, 2)
    sent = {"prompt": "x", "n_probs": 1, "logprobs": 4}
    assert NativeCompletionRequest.model_validate(sent).n_probs == 1


def test_an_alias_is_validated_as_its_field() -> None:
    with pytest.raises(ValidationError) as error:
        CompletionRequest.model_validate({"prompt": "x", "mirostat_mode": "fast"})
    assert error.value.errors()[0]["loc"] == ("mirostat",)


# -- DRY sequence breakers ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [["\n", ":"], '["\\n", ":"]', '"\\n", ":"', ' ["\\n",":"] '],
)
def test_sequence_breakers_as_a_list_or_json_in_a_string(value: object) -> None:
    assert dialects.sequence_breakers(value) == ["\n", ":"]


@pytest.mark.parametrize("value", ["nope[", "[1, 2]", '{"a": 1}', "[[]]"])
def test_bad_sequence_breakers_are_refused(value: str) -> None:
    with pytest.raises(ValueError, match="dry_sequence_breakers"):
        dialects.sequence_breakers(value)


def test_sequence_breakers_string_through_the_request() -> None:
    body = CompletionRequest.model_validate(
        {"prompt": "x", "dry_sequence_breakers": '["\\n", ":", "\\"", "*"]'}
    )
    assert body.sampling_params().dry_sequence_breakers == ("\n", ":", '"', "*")


# -- samplers ------------------------------------------------------------------------------------


def test_sampler_names_as_llama_cpp_spells_them() -> None:
    sillytavern = [
        "penalties",
        "dry",
        "top_n_sigma",
        "top_k",
        "typ_p",
        "top_p",
        "min_p",
        "xtc",
        "temperature",
        "adaptive_p",
    ]
    assert dialects.sampler_names(sillytavern) == sillytavern
    assert dialects.sampler_names(["Top-K", "minp", "nucleus", "temp", "typ"]) == [
        "top_k",
        "min_p",
        "top_p",
        "temperature",
        "typ_p",
    ]
    assert dialects.sampler_names("kpmxt") == ["top_k", "top_p", "min_p", "xtc", "temperature"]


# SillyTavern's `samplers` for the llama.cpp type: 1.12.6's default settings, and what
# 1.19.0 sends with every preset it ships (default/content/presets/textgen/*.json, with
# `adaptive_p` inserted by setSettingByName). llama.cpp knows neither `tfs_z` nor
# `typical_p` (common/sampling.cpp: its typical sampler is `typ_p`) and skips them.
SILLYTAVERN_1_12 = ["top_k", "tfs_z", "typical_p", "top_p", "min_p", "temperature"]
SILLYTAVERN_1_19 = [
    "penalties",
    "dry",
    "top_n_sigma",
    "top_k",
    "typ_p",
    "tfs_z",
    "typical_p",
    "xtc",
    "top_p",
    "adaptive_p",
    "min_p",
    "temperature",
]


@pytest.mark.parametrize(
    ("samplers", "known", "skipped"),
    [
        (SILLYTAVERN_1_12, ["top_k", "top_p", "min_p", "temperature"], "'tfs_z', 'typical_p'"),
        (
            SILLYTAVERN_1_19,
            [n for n in SILLYTAVERN_1_19 if n not in ("tfs_z", "typical_p")],
            "'tfs_z', 'typical_p'",
        ),
        (["top_k", "beam"], ["top_k"], "'beam'"),
        ("kpz", ["top_k", "top_p"], "'z'"),
    ],
)
def test_unknown_samplers_are_skipped_with_a_warning(
    samplers: list[str] | str, known: list[str], skipped: str, caplog: pytest.LogCaptureFixture
) -> None:
    """As llama-server does (common_sampler_types_from_names/_from_chars: LOG_WRN, skip)."""
    assert dialects.sampler_names(samplers) == known
    assert skipped in caplog.text and "skipping unknown sampler" in caplog.text


def test_too_many_samplers_are_refused() -> None:
    with pytest.raises(ParamError, match="at most 64 samplers") as error:
        dialects.sampler_names(["top_k"] * 65)
    assert error.value.param == "samplers"


@pytest.mark.parametrize(
    ("field", "sent", "meant"),
    [("top_k", -1, 0), ("top_k", 5, 5), ("seed", -1, None), ("seed", 7, 7)],
)
def test_other_servers_off_values_mean_off(field: str, sent: int, meant: int | None) -> None:
    """vLLM's and Aphrodite's top_k -1 (what SillyTavern sends them when Top K is 0), and
    llama.cpp's, KoboldCpp's and text-generation-webui's random seed -1."""
    body = CompletionRequest.model_validate({"prompt": "x", field: sent})
    assert getattr(body.sampling_params(), field) == (
        meant if meant is not None else getattr(SamplingParams(), field)
    )


def test_other_negative_top_k_is_still_refused() -> None:
    with pytest.raises(ParamError, match="top_k"):
        CompletionRequest.model_validate({"prompt": "x", "top_k": -2}).sampling_params()


def test_samplers_left_out_are_turned_off() -> None:
    params = SamplingParams(top_k=20, min_p=0.1, repeat_penalty=1.3, dry_multiplier=0.8)
    only = dialects.only_samplers(params, ["top_p", "min_p", "temperature"])
    assert (only.top_k, only.min_p, only.repeat_penalty, only.dry_multiplier) == (0, 0.1, 1.0, 0.0)
    assert only.temperature == params.temperature and only.top_p == params.top_p
    everything = list(dialects.SAMPLER_NAMES.values())
    assert dialects.only_samplers(params, everything) == params
    no_temperature = dialects.only_samplers(SamplingParams(temperature=0.0), ["top_k"])
    assert no_temperature.temperature == 1.0  # llama.cpp: no temperature sampler, no scaling
    mirostat = SamplingParams(mirostat=2)
    assert dialects.only_samplers(mirostat, ["top_k"]) == mirostat  # mirostat ignores the list


# -- logit bias in llama.cpp's list form ----------------------------------------------------------


def test_logit_bias_pairs_false_and_texts() -> None:
    def tokenize(text: str) -> list[int]:
        return [len(text), len(text) + 1]

    pairs = logit_bias([[3, 1.5], [4, False], ["ab", -2]], n_vocab=10, tokenize=tokenize)
    assert pairs == ((3, 1.5), (4, -100.0), (2, -2.0), (3, -2.0))
    assert logit_bias([], n_vocab=10) == ()
    assert logit_bias({"5": False}, n_vocab=10) == ((5, -100.0),)


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ([[1]], "pairs"),
        ([1, 2], "pairs"),
        ([[True, 1]], "pairs"),
        ([[1, "x"]], "a number or false"),
        ([[1, True]], "a number or false"),
        ([[11, 1]], "not in the vocabulary"),
        ([[1, 200]], r"\[-100, 100\]"),
        ([["a" * 600, 1]], "at most 512"),
    ],
)
def test_bad_logit_bias_lists(raw: list[object], words: str) -> None:
    with pytest.raises(ParamError, match=words) as error:
        logit_bias(raw, n_vocab=10, tokenize=lambda t: [1])
    assert error.value.param == "logit_bias"


# -- /completion's stop fields --------------------------------------------------------------------

PIECES = {1: b"The", 2: b" end", 3: b"\n\nUser", 4: b":", 5: b" caf", 6: b"\xc3", 7: b"\xa9"}


def spell(tokens: Sequence[int]) -> str:  # as native.Model.text, over PIECES
    return b"".join(PIECES[t] for t in tokens).decode("utf-8", errors="replace")


def result(content: str, tokens: list[int], reason: FinishReason | None) -> ChoiceSoFar:
    out = ChoiceSoFar(0, parts=[content], token_ids=tokens)
    out.finish_reason = reason
    return out


@pytest.mark.parametrize(
    ("content", "tokens", "reason", "stops", "expected"),
    [
        ("The end", [1, 2], FinishReason.LENGTH, [], ("limit", "")),
        ("The end", [1, 2], FinishReason.STOP, [], ("eos", "")),
        ("The end", [1, 2], FinishReason.STOP, ["\n\nUser:"], ("eos", "")),
        (
            "The end",
            [1, 2, 3, 4],
            FinishReason.STOP,
            ["\nUser", "\n\nUser:"],
            ("word", "\n\nUser:"),
        ),
        ("The end\n\n", [1, 2, 3], FinishReason.STOP, ["User", "Bot"], ("word", "User")),
        (" caf", [5, 6, 7], FinishReason.STOP, ["é"], ("word", "é")),
        ("The", [1], None, ["x"], ("none", "")),
        ("The", [1], FinishReason.ABORT, ["x"], ("none", "")),
    ],
)
def test_stop_type_and_stopping_word(
    content: str,
    tokens: list[int],
    reason: FinishReason | None,
    stops: list[str],
    expected: tuple[str, str],
) -> None:
    assert stop_info(result(content, tokens, reason), stops, spell) == expected


# -- the chat template for a model without one ----------------------------------------------------


class FakeModel:
    def __init__(self, **metadata: str) -> None:
        self._metadata = metadata

    def metadata(self, key: str) -> str | None:
        return self._metadata.get(key)


def test_template_choice_order(tmp_path: Path) -> None:
    own = FakeModel(**{"tokenizer.chat_template": "{{ x }}", "general.architecture": "gemma3"})
    assert choose(None, own)[0] == "{{ x }}"  # type: ignore[arg-type]
    base_gemma = FakeModel(**{"general.architecture": "gemma3"})
    source, origin, stops = choose(None, base_gemma)  # type: ignore[arg-type]
    assert source == packaged("gemma3.jinja") and "gemma3" in origin and stops == ()
    other = FakeModel(**{"general.architecture": "llama"})
    source, origin, stops = choose(None, other)  # type: ignore[arg-type]
    assert "<|im_start|>" in source and "ChatML" in origin and stops == CHATML_STOPS
    file = tmp_path / "t.jinja"
    file.write_text("{{ y }}")
    assert choose(file, own)[0] == "{{ y }}"  # type: ignore[arg-type]


def test_chatml_fallback_stops_at_the_end_of_turn_text() -> None:
    class Vocab:
        n_vocab = 1000

    body = ChatRequest.model_validate(
        {"messages": [{"role": "user", "content": "hi"}], "stop": ["\n\n"]}
    )
    params = chat_params(body, Vocab(), 5, 4096, CHATML_STOPS)  # type: ignore[arg-type]
    assert params.stop == ("\n\n", "<|im_end|>")
    assert chat_params(body, Vocab(), 5, 4096).stop == ("\n\n",)  # type: ignore[arg-type]


def test_the_packaged_gemma_template_is_googles() -> None:
    test_copy = Path(__file__).parents[1] / "data" / "gemma3_chat_template.jinja"
    assert packaged("gemma3.jinja") == test_copy.read_text()


# -- --n ---------------------------------------------------------------------------------------


def test_n_is_an_alias_of_max_n() -> None:
    parser = argparse.ArgumentParser()
    add_settings_flags(parser)
    assert settings_from_args(parser.parse_args(["--n", "8"])).max_n == 8
    assert settings_from_args(parser.parse_args(["--max-n", "4"])).max_n == 4
    assert parser.parse_args(["--n-ctx", "4096"]).n_ctx == 4096  # no prefix confusion
