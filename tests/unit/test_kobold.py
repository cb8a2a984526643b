"""KoboldCpp's fields read as koboldcpp.py reads them (api/schemas/kobold.py,
api/input/kobold.py) and the genkey registry (api/routes/kobold.py): pure logic, no model.
Against the real server: tests/integration/test_kobold.py."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from llama_srb.api.input.kobold import kobold_budget, sampler_names
from llama_srb.api.routes.kobold import MISS_WINDOW_S, MISSES_PER_MINUTE, GenKeys, Job
from llama_srb.api.schemas.kobold import KOBOLD_DEFAULTS, KoboldGenerateRequest


def body(**fields: object) -> KoboldGenerateRequest:
    return KoboldGenerateRequest.model_validate({"prompt": "x", **fields})


def test_koboldcpps_names_are_ours() -> None:
    sent = body(
        rep_pen=1.1,
        rep_pen_range=256,
        typical=0.9,
        sampler_seed=7,
        stop_sequence=["\nYou:"],
        use_default_badwordsids=True,
        banned_tokens=["forsooth"],
    )
    params = sent.sampling_params()
    assert (params.repeat_penalty, params.repeat_last_n, params.typical_p) == (1.1, 256, 0.9)
    assert (params.seed, params.stop, params.ignore_eos) == (7, ("\nYou:",), True)
    assert params.banned_strings == ("forsooth",)


def test_a_random_seed_and_kobolds_defaults() -> None:
    """Lite's sampler_seed -1 is "random"; what a request leaves out takes KoboldCpp's
    defaults (applied by kobold_params for the fields not set)."""
    assert body(sampler_seed=-1).sampling_params().seed is None
    assert body().max_length == 180
    assert KOBOLD_DEFAULTS["top_k"] == 100 and KOBOLD_DEFAULTS["repeat_last_n"] == 320


@pytest.mark.parametrize(
    ("order", "names"),
    [
        (None, ["dry", "penalties", "top_k", "typ_p", "top_p", "min_p", "temperature", "xtc"]),
        (
            [6, 0, 1, 3, 4, 2, 5],
            ["dry", "penalties", "top_k", "typ_p", "top_p", "min_p", "temperature", "xtc"],
        ),
        (
            [5, 6, 0, 1, 2, 3, 4],
            ["dry", "temperature", "penalties", "top_k", "top_p", "min_p", "typ_p", "xtc"],
        ),
        ([0, 5], ["dry", "top_k", "temperature", "xtc"]),
    ],
)
def test_sampler_order_as_koboldcpps_chain(order: list[int] | None, names: list[str]) -> None:
    """DRY first, the ids in order (top-a and tail-free have no sampler; min-p runs with
    top-p), XTC last: gpttype_adapter.cpp SampleLogits."""
    assert sampler_names(body(sampler_order=order)) == names


@pytest.mark.parametrize(
    "fields",
    [
        {"sampler_order": [0, 7]},
        {"sampler_order": [0] * 8},
        {"max_length": 0},
        {"max_context_length": 0},
        {"custom_token_bans": "1, two"},
        {"genkey": "k" * 129},
        {"images": ["aGk="]},
        {"tfs": 1.5},
        {"top_a": -1},
    ],
)
def test_out_of_range_fields_are_refused(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        body(**fields)


def test_token_bans_become_logit_biases() -> None:
    assert body(custom_token_bans="12, 345,").token_bans() == {"12": -100.0, "345": -100.0}


@pytest.mark.parametrize(
    ("fields", "n_ctx", "budget"),
    [
        ({}, 8192, (8192, 180)),
        ({"max_context_length": 2048, "max_length": 500}, 8192, (2048, 500)),
        ({"max_context_length": 100000}, 4096, (4096, 180)),  # at most the server's
        ({"max_context_length": 200, "max_length": 200}, 8192, (200, 184)),  # room for a prompt
        ({"max_context_length": 8, "max_length": 100}, 8192, (8, 4)),
    ],
)
def test_the_context_and_max_length(
    fields: dict[str, object], n_ctx: int, budget: tuple[int, int]
) -> None:
    assert kobold_budget(body(**fields), n_ctx) == budget


def test_a_genkey_counts_only_for_the_owner_that_started_it() -> None:
    keys = GenKeys()
    mine = ("address", "127.0.0.1", "null")
    job = Job(mine)
    keys.add("KCPP1234", job)
    assert keys.find("KCPP1234", mine) is job
    assert keys.find("KCPP1234", ("address", "127.0.0.1", "http://localhost:8000")) is None
    assert keys.find("KCPP1234", ("key", "bob")) is None
    assert keys.find("", mine) is None  # no key: nothing
    newer = Job(mine)
    keys.add("KCPP1234", newer)
    keys.remove("KCPP1234", job)  # the older one ending leaves the newer registered
    assert keys.find("KCPP1234", mine) is newer
    theirs = Job(("key", "bob"))
    keys.add("KCPP1234", theirs)  # the same four digits, another owner: both stay
    assert keys.find("KCPP1234", mine) is newer and keys.find("KCPP1234", ("key", "bob")) is theirs
    keys.remove("KCPP1234", newer)
    assert keys.find("KCPP1234", mine) is None


def test_an_owner_that_keeps_guessing_finds_nothing_for_a_minute() -> None:
    """The issue's attack: trying KCPP0000 to KCPP9999. After MISSES_PER_MINUTE keys that
    are not running, even a running one is not found until the misses are a minute old."""
    keys = GenKeys()
    guesser = ("address", "127.0.0.1", "")
    keys.add("KCPP4711", Job(guesser))
    for n in range(MISSES_PER_MINUTE):
        assert keys.find(f"KCPP{n:04d}", guesser, now=100.0 + n / 100) is None
    assert keys.find("KCPP4711", guesser, now=101.0) is None
    other = ("address", "127.0.0.1", "null")  # another page on the same machine: its own count
    keys.add("KCPP4711", mine := Job(other))
    assert keys.find("KCPP4711", other, now=101.0) is mine
    assert keys.find("KCPP4711", guesser, now=100.0 + MISS_WINDOW_S + 1) is not None
