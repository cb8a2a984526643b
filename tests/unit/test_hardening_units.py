"""Pieces of the hardening work that need no model: histogram buckets, API keys, route labels."""

from __future__ import annotations

import argparse
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


def test_keys_may_be_named_and_given_more_than_once(tmp_path: Path) -> None:
    key_file = tmp_path / "keys"
    key_file.write_text("alice: sk-1\nbob:sk-2\n  carol :  sk-3  \nwith:colon\n")
    settings = Settings(api_key=["dave: sk-4", "sk-5"], api_key_file=key_file)
    assert [(k.name, k.key) for k in settings.api_keys()] == [
        ("dave", "sk-4"),
        (None, "sk-5"),
        ("alice", "sk-1"),
        (None, "bob:sk-2"),  # a colon without a space: a key of the old format, whole
        ("carol", "sk-3"),
        (None, "with:colon"),
    ]
    keys = ApiKeys(settings)
    assert keys.several
    assert [keys.label(k) for k in (b"sk-1", b"sk-4", b"sk-5", b"bob:sk-2", b"sk-")] == [
        "alice",
        "dave",
        "key-2",
        "key-4",
        None,
    ]


def test_one_writers_keys_do_not_tell_clients_apart() -> None:
    assert not ApiKeys(Settings(api_key=["ann: a1", "ann: a2"])).several
    assert not ApiKeys(Settings(api_key="only")).several


def test_an_admin_key_is_marked_and_a_mistaken_admin_line_is_refused(tmp_path: Path) -> None:
    key_file = tmp_path / "keys"
    key_file.write_text("admin:root: sk-root\nalice: sk-1\n")
    settings = Settings(api_key=["admin:ops: sk-ops"], api_key_file=key_file)
    assert [(k.name, k.key, k.admin) for k in settings.api_keys()] == [
        ("ops", "sk-ops", True),
        ("root", "sk-root", True),
        ("alice", "sk-1", False),
    ]
    keys = ApiKeys(settings)
    headers = [(b"authorization", b"Bearer sk-root")]
    assert keys.identify({"headers": headers}) == ("root", True)
    assert keys.identify({"headers": [(b"authorization", b"Bearer sk-1")]}) == ("alice", False)
    for spec in ("admin: sk-x", "admin:sk-x", "admin:a b: sk"):  # no name, or not one
        with pytest.raises(ValidationError, match="admin:name: key"):
            Settings(api_key=spec)


@pytest.mark.parametrize("spec", ["alice: ", " ", "bob:  "])
def test_a_named_key_without_a_key_is_refused_at_startup(spec: str) -> None:
    with pytest.raises(ValidationError, match="api_key"):
        Settings(api_key=spec)


def test_repeated_api_key_flags_are_all_kept() -> None:
    from llama_srb.cli import add_settings_flags, settings_from_args

    parser = argparse.ArgumentParser()
    add_settings_flags(parser)
    args = parser.parse_args(["--api-key", "alice: a", "--api-key", "b"])
    assert [k.name for k in settings_from_args(args).api_keys()] == ["alice", None]


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


def test_trusted_proxies_are_addresses_or_ranges() -> None:
    proxies = Settings(trusted_proxies="127.0.0.1, 10.0.0.0/8,::1").trusted_proxies
    assert proxies == ["127.0.0.1", "10.0.0.0/8", "::1"]
    with pytest.raises(ValidationError, match="not an IP address"):
        Settings(trusted_proxies="nginx.local")
