"""Backend sampling (--backend-sampling) on both bundled models' real rows: a top_k(64)
chain attached to the sequences and run inside llama_decode (llama.cpp's own, and
llama_srb/_cpu_cut.c's, which a CPU runs) leaves the 64 most likely tokens of each row;
every sampler and order of test_sampling_paths.py's cases either
takes the host path (the device cannot decide it: the table in docs/sampling.md) or picks
from those candidates the token the whole row gives it, seeded draws included, or says it
cannot (then it reads the whole row). The rows and the candidates come from the same
decode (a chain-less row in it makes llama.cpp copy the whole rows out too), so the two
paths read the same numbers by construction. Then the engine and the server with it on."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt
import pytest

from llama_srb.bundled_model import bundled_model_path
from llama_srb.engine.build import build
from llama_srb.engine.device_cut import DEVICE_TOP_K
from llama_srb.engine.engine import Engine
from llama_srb.engine.kv import KvBudget
from llama_srb.engine.spec import RequestSpec
from llama_srb.native import (
    SAMPLER_ACCEPT,
    SAMPLER_APPLY,
    Batch,
    Context,
    ContextOptions,
    Model,
    NativeError,
)
from llama_srb.sampling import _rows
from llama_srb.sampling.branch import BranchSampler, build_samplers
from llama_srb.sampling.cut import Row
from llama_srb.sampling.device_row import DeviceRow, Undecided, sort_candidates
from llama_srb.sampling.params import SamplingParams
from tests.integration.test_sampling_paths import CASES, STORY
from tests.support.server import run_server

N = 8  # sequences, each with the chain
STEPS = 6
# The cases a device top-64 cannot decide, with why (docs/sampling.md's table).
HOST_PATH = {
    "top_k 2000": "a top-k of 64 or more",
    "xtc": "its top-k of 100 is 64 or more",
    "top_p then min_p (SillyTavern's default)": "top-p needs the row's normalizer",
    "top_p alone": "top-p needs the row's normalizer",
    "top_p then top_k": "top-p needs the row's normalizer",
    "typical first": "typical needs every token",
    "top_n_sigma first": "top-n-sigma needs every token",
    "dynamic temperature first": "dynamic temperature needs every token",
    "penalties": "penalties raise no token, but change them beyond the cut",
    "DRY": "DRY changes tokens beyond the cut",
    "logit bias": "a bias raises tokens from off the list",
    "every token (no filter)": "a draw from every token",
    "SillyTavern 1.12 order": "top-p needs the row's normalizer",
    "SillyTavern 1.19 order": "penalties and DRY",
}


@dataclass
class DecodedRows:
    model: Model
    cpu_cut: bool
    whole: list[npt.NDArray[np.float32]]  # step-major, N rows a step
    candidates: list[tuple[npt.NDArray[np.int32], npt.NDArray[np.float32]]]


CUTS = {"llama.cpp's top_k": False, "the CPU's cut": True}  # ContextOptions.cpu_cut


@pytest.fixture(scope="module", params=list(CUTS))
def decoded(bundled_model: str, request: pytest.FixtureRequest) -> Iterator[DecodedRows]:
    model = Model(bundled_model_path(bundled_model))
    options = ContextOptions(
        n_ctx=1024,
        n_seq_max=N + 1,
        n_batch=256,
        device_top_k=DEVICE_TOP_K,
        chained=N,
        cpu_cut=CUTS[request.param],
    )
    ctx = Context(model, options)
    tokens = model.tokenize(STORY)
    prompt = tokens[:30]
    batch = Batch(256)
    batch.add_span(prompt, 0, 0, False)
    ctx.decode(batch)
    for seq in range(1, N + 1):
        ctx.seq_cp(0, seq)
    whole, candidates = [], []
    for step in range(STEPS):
        batch.clear()
        for seq in range(N + 1):  # seq N carries no chain: the decode copies whole rows
            batch.add(tokens[30 + (seq * 3 + step) % 20], len(prompt) + step, seq, True)
        ctx.decode(batch)
        logits = ctx.logits()
        ids, values = ctx.candidates(range(N), DEVICE_TOP_K)
        assert ids.shape == values.shape == (N, DEVICE_TOP_K)
        with pytest.raises(NativeError):  # seq N: no chain, no candidates
            ctx.candidates([N], DEVICE_TOP_K)
        for i in range(N):
            whole.append(logits[i].copy())
            candidates.append((ids[i], values[i]))
    yield DecodedRows(model, options.cpu_cut, whole, candidates)
    batch.close()
    ctx.close()
    model.close()


@pytest.mark.parametrize("cut", list(CUTS))
def test_candidates_are_read_by_output_row(bundled_model: str, cut: str) -> None:
    """Output rows are numbered as `Batch.add` numbers them, which is not the batch's
    token index once a token without logits comes before one with: llama.cpp's `_ith`
    calls take the latter, so each row must be the one asked for (a prompt's last row
    after its other tokens, in one call with a decode row of another sequence, and a
    chained sequence with no row in it, whose chain llama.cpp runs on another's row)."""
    model = Model(bundled_model_path(bundled_model))
    options = ContextOptions(
        n_ctx=256,
        n_seq_max=4,
        n_batch=64,
        device_top_k=DEVICE_TOP_K,
        chained=3,
        cpu_cut=CUTS[cut],
    )
    ctx = Context(model, options)
    batch = Batch(64)
    try:
        tokens = model.tokenize(STORY)
        batch.add_span(tokens[:4], 0, 1, False)
        ctx.decode(batch)
        batch.clear()
        rows = [
            batch.add(tokens[4], 4, 1, True),  # a decode row
            batch.add_span(tokens[:12], 0, 0, True),  # a prompt: its last row, 11 tokens on
            batch.add(tokens[0], 0, 3, True),  # no chain: llama.cpp copies every row out
        ]
        ctx.decode(batch)
        assert rows == [0, 1, 2]
        ids, values = ctx.candidates(rows[:2], DEVICE_TOP_K)
        logits = ctx.logits()
        for slot, row in enumerate(rows[:2]):
            top = np.sort(logits[row])[::-1][:DEVICE_TOP_K]
            assert np.sort(values[slot])[::-1].tolist() == top.tolist()
            assert values[slot].tolist() == logits[row][ids[slot]].tolist()
    finally:
        batch.close()
        ctx.close()
        model.close()


def test_the_device_s_candidates_are_each_row_s_64_most_likely(decoded: DecodedRows) -> None:
    for row, (ids, values) in zip(decoded.whole, decoded.candidates, strict=True):
        assert values.tolist() == row[ids].tolist()  # the row's own logits, not rescaled
        assert len(set(ids.tolist())) == DEVICE_TOP_K
        assert values.min() >= np.sort(row)[-DEVICE_TOP_K]  # none left out above them
        ranked, _, _ = sort_candidates(ids[None], values[None])
        if decoded.cpu_cut:  # in the host's order already: its sort only reads them
            assert ids.tolist() == ranked[0].tolist()


CASES_AND_GREEDY: dict[str, dict[str, object]] = {
    **CASES,
    "greedy": {"temperature": 0.0},
    "top_k 40, cooler": {"top_k": 40, "top_p": 1.0, "min_p": 0.0, "temperature": 0.7},
    "temperature before top_k": {"temperature": 1.4, "sampler_order": ("temperature", "top_k")},
    "top_k 63": {"top_k": 63, "top_p": 0.9},
}


@pytest.mark.parametrize("forbidden", [False, True], ids=["", "eog masked"])
@pytest.mark.parametrize("case", list(CASES_AND_GREEDY))
def test_every_case_picks_the_host_path_s_token_or_takes_it(
    decoded: DecodedRows, case: str, forbidden: bool
) -> None:
    params = SamplingParams(**CASES_AND_GREEDY[case])  # type: ignore[arg-type]
    seeds = [11 + i for i in range(N)]
    host = build_samplers(decoded.model, params, seeds)
    device = build_samplers(decoded.model, params, seeds)
    in_c = build_samplers(decoded.model, params, seeds)  # a step's rows in one C loop
    eog_ids = np.unique(np.array(decoded.model.eog_tokens, np.int64))
    eog = eog_ids if forbidden else None
    decides = device[0].device_k is not None and device[0].device_k < DEVICE_TOP_K
    assert decides == (case not in HOST_PATH), HOST_PATH.get(case, "decided on the device")
    assert (in_c[0].device_pick is not None) == (device[0].device_k is not None)
    undecided = 0
    for step in range(STEPS):
        rows = decoded.whole[step * N : (step + 1) * N]
        cut = decoded.candidates[step * N : (step + 1) * N]
        if decides:
            picks = c_picks(in_c, cut, eog_ids, forbidden)
        for i, (row, (ids, values)) in enumerate(zip(rows, cut, strict=True)):
            want = host[i].sample(Row(row.copy()), eog)
            if not decides:
                continue
            try:
                got = device[i].sample(DeviceRow(ids, values), eog)
            except Undecided:
                undecided += 1
                assert picks[i] is None, f"step {step}, row {i}: C decided what Python did not"
                got = device[i].sample(Row(row.copy()), eog)
                in_c[i].sample(Row(row.copy()), eog)
            assert got == want, f"step {step}, row {i}"
            assert picks[i] is None or picks[i] == want, f"step {step}, row {i}: C's pick"
    if decides:
        assert undecided < len(decoded.whole) // 4  # the candidates decide nearly every row
    for sampler in host + device + in_c:
        sampler.close()


def c_picks(
    samplers: list[BranchSampler],
    cut: list[tuple[npt.NDArray[np.int32], npt.NDArray[np.float32]]],
    eog: npt.NDArray[np.int64],
    masked: bool,
) -> list[int | None]:
    """The picks of a step's rows as the engine makes them (DeviceCut.pick): sorted and
    checked for end of generation at once, then every branch's chain in one C loop."""
    ids, values, holds = sort_candidates(
        np.stack([i for i, _ in cut]), np.stack([v for _, v in cut]), eog
    )
    work = []
    for slot, sampler in enumerate(samplers):
        assert sampler.device_pick is not None
        work.append((slot, masked, sampler.device_pick))
    return _rows.pick_candidates(
        ids, values, DEVICE_TOP_K, holds, eog, False, SAMPLER_APPLY, SAMPLER_ACCEPT, work
    )


def test_a_chain_the_candidates_fail_reads_whole_rows_for_a_while(decoded: DecodedRows) -> None:
    """A pick the candidates cannot prove costs the engine a decode of its own, so a chain
    whose rows are flat (a wide min-p) backs off to whole rows: 16, then 32 after a second
    miss in a row; a decided pick starts it over."""
    sampler = build_samplers(decoded.model, SamplingParams(top_k=0, top_p=1.0, min_p=0.1), [3])[0]
    flat = DeviceRow(np.arange(DEVICE_TOP_K, dtype=np.int32), np.zeros(DEVICE_TOP_K, np.float32))
    whole = decoded.whole[0]
    for backoff in (16, 32):
        assert sampler.device_k == 1
        with pytest.raises(Undecided):
            sampler.sample(flat)
        for _ in range(backoff):  # the first: the same step's row, read whole
            assert sampler.device_k is None
            sampler.sample(Row(whole.copy()))
    assert sampler.device_k == 1
    sampler.sample(DeviceRow(*decoded.candidates[0]))  # decided
    with pytest.raises(Undecided):
        sampler.sample(flat)
    for _ in range(16):
        sampler.sample(Row(whole.copy()))
    assert sampler.device_k == 1
    sampler.close()


def engine_tokens(
    model: Model, cut: str | None, body: dict[str, Any]
) -> tuple[list[list[int]], Engine]:
    """`cut`: one of CUTS, or None for backend sampling off."""
    budget = KvBudget(N, 2048, cache_paths=2, cache_cells=0)
    k = DEVICE_TOP_K if cut else 0
    options = ContextOptions(
        n_ctx=2048,
        n_seq_max=budget.n_seq + bool(cut),
        n_batch=256,
        device_top_k=k,
        chained=N,
        cpu_cut=bool(cut and CUTS[cut]),
    )
    ctx = Context(model, options)
    engine = Engine(model, ctx, budget, device_top_k=k, chained=N)
    params = SamplingParams(max_tokens=12, ignore_eos=True, seed=5, **body)
    prompt = model.tokenize(STORY)[:40]
    engine.add(build(model, RequestSpec(prompt, params, N)).take())
    tokens: dict[int, list[int]] = {}
    while engine.has_work:
        for output in engine.step():
            assert output.error is None
            for choice in output.choices:
                tokens.setdefault(choice.index, []).extend(choice.token_ids)
    engine.close()
    ctx.close()
    return [tokens[i] for i in range(N)], engine


@pytest.mark.parametrize("cut", list(CUTS))
@pytest.mark.parametrize(
    "body",
    [
        {},
        {"temperature": 0.0},
        {"top_k": 0, "top_p": 1.0, "min_p": 0.05},
        {"top_k": 0, "top_p": 0.9},  # the host path
    ],
)
def test_the_engine_with_it_on_draws_what_it_draws_with_it_off(
    bundled_model: str, body: dict[str, Any], cut: str
) -> None:
    """The same batches either way (rows that all carry the chain need no scratch token),
    so the same logits: only what the host reads of them differs."""
    model = Model(bundled_model_path(bundled_model))
    try:
        off, _ = engine_tokens(model, None, body)
        on, engine = engine_tokens(model, cut, body)
    finally:
        model.close()
    assert on == off
    stats = engine.stats
    if body.get("top_p", 1.0) < 1.0:  # top-p first: whole rows
        assert stats.device_rows == 0
        return
    assert stats.device_rows > 0
    assert stats.logits_bytes_read <= stats.device_rows * DEVICE_TOP_K * 8 + (
        stats.device_undecided * 4 * model.n_vocab
    )


def test_a_server_with_it_on_serves_both_paths(tmp_path: Path, bundled_model: str) -> None:
    """With --max-n 4, 4 ids carry the cut. The first request's branches are parked in
    the prefix cache when it ends; the same request again still gets all 4 (the parked
    paths moved off them) and reads a few hundred bytes a token, not whole rows."""
    args = ("--model", bundled_model, "--n-ctx", "2048", "--backend-sampling", "on")
    body = {"prompt": STORY, "n": 4, "max_tokens": 8, "seed": 3, "ignore_eos": True}
    with (
        run_server(tmp_path, *args, "--max-n", "4") as server,
        httpx.Client(base_url=server.base_url, timeout=120) as client,
    ):
        device = client.post("/v1/completions", json=body)
        host = client.post(
            "/v1/completions",
            json={"prompt": STORY, "n": 2, "max_tokens": 8, "top_k": 0, "top_p": 0.9},
        )
        before = server.metrics()
        again = client.post("/v1/completions", json={**body, "seed": 4})
        after = server.metrics()
    assert device.status_code == 200 and host.status_code == 200, device.text + host.text
    assert len(device.json()["choices"]) == 4 and len(host.json()["choices"]) == 2
    assert again.status_code == 200, again.text

    def grew(name: str) -> float:
        return after[name] - before[name]

    read, drawn = (
        grew("llama_srb_logits_bytes_read_total"),
        grew("llama_srb_generated_tokens_total"),
    )
    assert drawn == 4 * 8 and read / drawn < 4096, (read, drawn)  # a row is 196 KB or 1 MB
    # 8 steps of n=4, the first row shared
    assert after['llama_srb_backend_sampling_rows_total{outcome="candidates"}'] >= 8
