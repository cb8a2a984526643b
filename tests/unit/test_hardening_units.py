"""Pieces of the hardening work that need no model: histogram buckets, API keys, route labels."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from llama_srb.api.auth import ApiKeys
from llama_srb.api.middleware import route_pattern
from llama_srb.config import Settings
from llama_srb.engine.histogram import Histogram


def test_histogram_buckets_are_cumulative_with_le_semantics() -> None:
    hist = Histogram(bounds=(0.1, 1.0))
    for value in (0.05, 0.1, 0.5, 2.0):
        hist.observe(value)
    assert hist.cumulative() == [(0.1, 2), (1.0, 3), (float("inf"), 4)]
    assert hist.count == 4 and hist.total == pytest.approx(2.65)


def test_keys_come_from_the_flag_and_the_file(tmp_path: Path) -> None:
    key_file = tmp_path / "keys"
    key_file.write_text("# team keys\n\nalpha\n  beta  \n")
    keys = ApiKeys(Settings(api_key="flag-key", api_key_file=key_file))
    assert keys.required
    assert all(keys.accepts(k) for k in (b"flag-key", b"alpha", b"beta"))
    assert not any(keys.accepts(k) for k in (b"", b"alph", b"alpha ", b"# team keys"))
    assert not ApiKeys(Settings()).required


@pytest.mark.parametrize("content", [None, "# only a comment\n\n"])
def test_a_missing_or_empty_key_file_is_refused_at_startup(
    tmp_path: Path, content: str | None
) -> None:
    key_file = tmp_path / "keys"
    if content is not None:
        key_file.write_text(content)
    with pytest.raises(ValidationError, match="api_key_file"):
        Settings(api_key_file=key_file)


def test_cors_origins_split_on_commas() -> None:
    assert Settings(cors_origins="https://a.example, http://b:3000").cors_origins == [
        "https://a.example",
        "http://b:3000",
    ]


def test_cors_origins_from_the_environment_are_a_comma_list_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LLAMA_SRB_CORS_ORIGINS", "null,https://a.example")
    assert Settings().cors_origins == ["null", "https://a.example"]


def test_file_pages_and_loopback_pages_by_default() -> None:
    assert Settings().cors_origins == ["null", "loopback"]


def test_route_labels_match_templates_not_raw_paths() -> None:
    assert route_pattern("/v1/models/{model}").match("/v1/models/gemma")
    assert not route_pattern("/v1/models/{model}").match("/v1/models/a/b")
    assert route_pattern("/v1/completions").match("/v1/completions")
    assert not route_pattern("/v1/completions").match("/v1/completionsX")
