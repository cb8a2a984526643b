"""Backend sampling (issue 39, `--backend-sampling`): what the server's step costs on the
host per branch-step and reads of llama.cpp's output with it off and on, and what
llama.cpp's device cut (a `top_k(K)` chain attached to sequences with `llama_set_sampler`,
run inside `llama_decode`'s graph) costs and saves on this machine, real decodes throughout.

    .venv/bin/python bench/bench_backend_sampling.py [--ns 8,64] [--tokens 32] [--k 64]
                                                     [--presets defaults,st-default,...]
                                                     [--repeats 1] [--parts 1,2,3]
                                                     [--model gemma-3-270m]
                                                     [--no-sillytavern]

1. **The engine** (the server's step: `Engine` over a real context, one request of n
   branches stepped to its end alone, `ignore_eos`), backend sampling off and on (its
   top_k(64) chain on the request's n sequence ids, as `--backend-sampling on` with
   `--max-n` n): host ms per branch-step (the wall less `llama_decode`'s time, over the
   tokens drawn), logits bytes the host read per branch-step
   (`llama_srb_logits_bytes_read_total`), ms per decode step, the run's wall and its ratio;
   with `--repeats`, off and on alternate and each figure is the median.
2. **Sampling alone, host rows against llama.cpp's device cut**: a loop of n sequences
   decoded together, each branch sampling its token with the request's own chain
   (sampling/branch.py). *host*: from the whole row, as the engine does. *device*: from
   the K candidates llama.cpp's `top_k(K)` left, read and sorted as the engine reads them
   (a call's rows at once: `Context.candidates`, `sort_candidates`), the chain finished
   on them exactly as the host path finishes its own cut, when the candidates prove it
   (the chain's first cut is a top-k of k < K, the greedy pick or a min-p, and no head;
   the k-th candidate, or the min-p's threshold, above the K-th); other chains have no
   device column. Both loops decode the same
   tokens in the same batches, so the same rows: `same` counts the branches whose tokens
   agree over the run (every branch, when the device cut loses nothing). Host ms is the
   loop's wall less `llama_decode`; decode ms is per step, the device cut included; the
   first step (llama.cpp's setup for a new batch shape) is not counted in either.
3. The cost of attaching: the first decode after `llama_set_sampler` on every sequence
   re-reserves llama.cpp's scheduler.
4. **From outside, as issue 39 checks it** (`--parts 4`): a server (its defaults, a CPU or
   GPU build as installed) with `--backend-sampling off`, then one with it `on`; on each,
   one `/completion` request of n x `--tokens` per preset and n, in turn, `ignore_eos`,
   seed 1: host ms per branch-step (the client's wall less `llama_decode`'s time from
   `/metrics`, over the tokens drawn), the wall, and the distinct choices; then greedy
   n=4 x `--tokens` on both, whose text must be the same.
5. **Before and after** (`--parts 5 --checkout DIR`): a server from an older llama-srb
   checkout and one from this tree, both with it `on`, started together; each round sends
   one request of n x `--tokens` (defaults, `ignore_eos`, seed 1), whole and streamed (its
   events read as they come), to each in turn, the order alternating, a pause between: the median host ms per branch-step over
   `--rounds`, as part 4 counts it. On a noisy machine this is fairer than two sittings.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import llama_cpp as C
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_host import STORY, request_params
from bench.llama_tools import EngineClock
from bench.presets import all_presets
from llama_srb.bundled_model import DEFAULT
from llama_srb.config import Settings
from llama_srb.engine.build import build
from llama_srb.engine.device_cut import DEVICE_TOP_K
from llama_srb.engine.engine import Engine
from llama_srb.engine.kv import KvBudget
from llama_srb.engine.spec import RequestSpec
from llama_srb.loader import model_options
from llama_srb.native import Batch, Context, ContextOptions, Model, has_gpu_device
from llama_srb.sampling.branch import BranchSampler, build_samplers
from llama_srb.sampling.cut import Row
from llama_srb.sampling.device_row import DeviceRow, Undecided, sort_candidates
from tests.support.server import RunningServer, run_server

N_CTX = 8192
PROMPT_TOKENS = 32


@dataclass
class EngineRun:
    host_ms: float  # per branch-step
    bytes_per_step: float  # logits bytes per branch-step
    decode_ms: float  # per step
    wall: float  # seconds


def engine_run(
    model: Model, body: dict[str, Any], n: int, tokens: int, device: bool = False
) -> EngineRun:
    """One request of n branches, stepped to its end alone, with real decodes; with
    `device`, backend sampling on (the server's --backend-sampling on: a top_k(64) chain
    on each of the n sequence ids, one scratch id more)."""
    k = DEVICE_TOP_K if device else 0
    budget = KvBudget(n, N_CTX, cache_paths=8, cache_cells=0)
    options = ContextOptions(
        n_ctx=N_CTX,
        n_seq_max=budget.n_seq + device,
        n_batch=512,
        device_top_k=k,
        chained=n,
        cpu_cut=not has_gpu_device(),  # as the server chooses it
    )
    ctx = Context(model, options)
    engine = Engine(model, ctx, budget, device_top_k=k, chained=n)
    engine.warm_up()
    params = request_params(model, {**body, "seed": 1}, tokens)
    prompt = model.tokenize(STORY)[:PROMPT_TOKENS]
    engine.add(build(model, RequestSpec(prompt, params, n)).take())
    started = time.perf_counter()
    while engine.has_work:
        for output in engine.step():
            if output.error is not None:
                raise RuntimeError(output.error)
    wall = time.perf_counter() - started
    stats = engine.stats
    drawn = engine.branch_step.drawn
    result = EngineRun(
        (wall - stats.decode_seconds) / drawn * 1e3,
        stats.logits_bytes_read / drawn,
        stats.decode_seconds / stats.steps * 1e3,
        wall,
    )
    engine.close()
    ctx.close()
    return result


def median_run(runs: list[EngineRun]) -> EngineRun:
    """Each figure's median over the runs."""
    return EngineRun(
        *(float(np.median([getattr(r, f) for r in runs])) for f in EngineRun.__dataclass_fields__)
    )


@dataclass
class LoopRun:
    host_ms: float  # per branch-step
    decode_ms: float  # per step
    bytes_per_step: float
    wall: float
    tokens: list[list[int]]
    undecided: int  # rows whose candidates did not prove the cut


def provable(sampler: BranchSampler, k_device: int) -> bool:
    """Whether the device's top-K can decide this chain's cut (sampling/device_row.py)."""
    return sampler.device_k is not None and sampler.device_k < k_device


def sampling_loop(
    model: Model, body: dict[str, Any], n: int, tokens: int, k_device: int, device: bool
) -> LoopRun:
    """n sequences decoded together for `tokens` steps, each branch sampling from its row
    (host) or from the device's K candidates (device)."""
    ctx = Context(model, ContextOptions(n_ctx=N_CTX, n_seq_max=n, n_batch=512))
    params = request_params(model, {**body, "seed": 1}, tokens)
    samplers = build_samplers(model, params, [1 + i for i in range(n)])
    chains = []
    if device:
        for seq in range(n):
            chain = C.llama_sampler_chain_init(C.llama_sampler_chain_default_params())
            C.llama_sampler_chain_add(chain, C.llama_sampler_init_top_k(k_device))
            assert C.llama_set_sampler(ctx.ptr, seq, chain)
            chains.append(chain)
    prompt = model.tokenize(STORY)[:PROMPT_TOKENS]
    batch = Batch(max(n, len(prompt)))
    batch.add_span(prompt[:-1], 0, 0, False)
    ctx.decode(batch)
    for seq in range(1, n):
        ctx.seq_cp(0, seq)
    last = [prompt[-1]] * n
    out: list[list[int]] = [[] for _ in range(n)]
    decode = host = 0.0
    undecided = 0
    read = 0
    for step in range(tokens):
        batch.clear()
        for seq in range(n):
            batch.add(last[seq], len(prompt) - 1 + step, seq, True)
        started = time.perf_counter()
        ctx.decode(batch)
        C.llama_synchronize(ctx.ptr)
        decoded = time.perf_counter()
        if step:  # the first call of this shape sets llama.cpp up: not counted
            decode += decoded - started
        if device:  # as the engine reads them (engine/device_cut.py): a call's at once
            ids, values, _ = sort_candidates(*ctx.candidates(range(n), k_device))
            read += ids.shape[1] * 8 * n
        for i, sampler in enumerate(samplers):
            if device:
                try:
                    token = sampler.sample(DeviceRow(ids[i], values[i], ordered=True))
                except Undecided:
                    undecided += 1  # the engine reads the row then (engine/device_cut.py)
                    token = -1
            else:
                row = Row(ctx.logits()[i])
                read += row.logits.nbytes
                token = sampler.sample(row)
            out[i].append(token)
            last[i] = max(token, 0)
        if step:
            host += time.perf_counter() - decoded
    wall = decode + host  # over the steps counted
    for sampler in samplers:
        sampler.close()
    batch.close()
    ctx.close()
    for chain in chains:
        C.llama_sampler_free(chain)
    steps = n * (tokens - 1)
    return LoopRun(
        host / steps * 1e3, decode / (tokens - 1) * 1e3, read / (n * tokens), wall, out, undecided
    )


def attach_cost(model: Model, n_seq: int, k_device: int) -> tuple[float, float, float]:
    """Seconds of: a plain decode of one token, llama_set_sampler on every sequence, and
    the first decode after it (llama.cpp re-reserves its scheduler for the new graph)."""
    ctx = Context(model, ContextOptions(n_ctx=N_CTX, n_seq_max=n_seq, n_batch=512))
    batch = Batch(1)
    timings = []
    for pos in range(2):
        batch.clear()
        batch.add(2, pos, 0, True)
        started = time.perf_counter()
        ctx.decode(batch)
        timings.append(time.perf_counter() - started)
    chains = []
    started = time.perf_counter()
    for seq in range(n_seq):
        chain = C.llama_sampler_chain_init(C.llama_sampler_chain_default_params())
        C.llama_sampler_chain_add(chain, C.llama_sampler_init_top_k(k_device))
        C.llama_set_sampler(ctx.ptr, seq, chain)
        chains.append(chain)
    attach = time.perf_counter() - started
    batch.clear()
    batch.add(2, 2, 0, True)
    started = time.perf_counter()
    ctx.decode(batch)
    first = time.perf_counter() - started
    batch.close()
    ctx.close()
    for chain in chains:
        C.llama_sampler_free(chain)
    return timings[-1], attach, first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ns", default="8,64")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--k", type=int, default=64, help="the device cut's K")
    parser.add_argument(
        "--presets", default="defaults,greedy,st-default,st-universal-light,st-neutral"
    )
    parser.add_argument("--parts", default="1,2,3", help="which tables (1,2,3,4)")
    parser.add_argument(
        "--repeats", type=int, default=1, help="engine runs of each, off and on alternated"
    )
    parser.add_argument("--model", default=DEFAULT, help="a bundled model's name or a GGUF file")
    parser.add_argument("--no-sillytavern", action="store_true", help="skip its presets")
    parser.add_argument("--checkout", type=Path, help="part 5: the older checkout's tree")
    parser.add_argument("--rounds", type=int, default=3, help="part 5: requests of each n")
    args = parser.parse_args()
    ns = [int(x) for x in args.ns.split(",")]
    presets = all_presets(with_sillytavern=not args.no_sillytavern)
    names = args.presets.split(",")
    print(f"\n{args.model}: {args.tokens} tokens per branch, ignore_eos, real decodes")
    parts = args.parts.split(",")
    if "4" in parts:  # first: the servers load the model themselves
        server_table(args.model, presets, names, ns, args.tokens)
    if "5" in parts:
        if args.checkout is None:
            parser.error("--parts 5 needs --checkout")
        before_after_table(args.model, args.checkout, ns, args.tokens, args.rounds)
    settings = Settings(model=args.model)
    model = Model(settings.resolved_model_path(), model_options(settings))
    quiet = C.llama_log_callback(lambda *_: None)  # kept: llama.cpp calls it from C
    C.llama_log_set(quiet, ctypes.c_void_p())
    if "1" in parts:
        engine_table(model, presets, names, ns, args.tokens, args.repeats)
    if "2" in parts:
        loop_table(model, presets, names, ns, args.tokens, args.k)
    if "3" in parts:
        attach_table(model, args.k)
    print(
        "\nreproduce: .venv/bin/python bench/bench_backend_sampling.py"
        f" --ns {args.ns} --tokens {args.tokens} --k {args.k} --presets {args.presets}"
        + (f" --repeats {args.repeats}" if args.repeats > 1 else "")
        + (f" --parts {args.parts}" if args.parts != "1,2,3" else "")
        + (f" --checkout {args.checkout} --rounds {args.rounds}" if "5" in parts else "")
        + ("" if args.model == DEFAULT else f" --model {args.model}")
    )
    model.close()


@dataclass
class Served:
    host_ms: float  # per branch-step
    wall: float  # seconds
    distinct: int  # choices
    texts: list[str]


def served(
    server: RunningServer, http: httpx.Client, body: dict[str, Any], stream: bool = False
) -> Served:
    """One /completion request, whole or streamed (its events read as they come); host
    time is its wall less llama_decode's (/metrics)."""
    before = EngineClock.read(server)
    started = time.perf_counter()
    if stream:
        texts: dict[int, str] = {}
        with http.stream("POST", f"{server.base_url}/completion", json=body) as response:
            response.raise_for_status()
            for line in response.iter_lines():
                if line.startswith("data: "):
                    event = json.loads(line[6:])
                    index = event.get("index", 0)
                    texts[index] = texts.get(index, "") + event.get("content", "")
        wall = time.perf_counter() - started
        results = list(texts.values())
    else:
        response = http.post(f"{server.base_url}/completion", json=body)
        wall = time.perf_counter() - started
        response.raise_for_status()
        answer = response.json()  # one result object for n = 1, else a list of them
        results = [r["content"] for r in (answer if isinstance(answer, list) else [answer])]
    clock = EngineClock.read(server) - before
    host_ms = (wall - clock.decode_seconds) / clock.drawn * 1e3
    return Served(host_ms, wall, len(set(results)), results)


def server_table(
    model: str, presets: dict[str, Any], names: list[str], ns: list[int], tokens: int
) -> None:
    print("\n4. From outside: a server with --backend-sampling off, then one with it on\n")
    runs: dict[str, list[Served]] = {}
    for mode in ("off", "on"):
        with (
            tempfile.TemporaryDirectory() as tmp,
            run_server(Path(tmp), "--model", model, "--backend-sampling", mode) as server,
            httpx.Client(timeout=httpx.Timeout(3600.0)) as http,
        ):
            bodies = [
                {**presets[name], "prompt": STORY, "n": n, "n_predict": tokens, "seed": 1}
                for name in names
                for n in ns
            ]
            greedy = {"prompt": STORY, "n": 4, "n_predict": tokens, "temperature": 0}
            runs[mode] = [served(server, http, {**b, "ignore_eos": True}) for b in bodies]
            runs[mode].append(served(server, http, greedy))
    print("| preset | n | host ms / branch-step | wall s | wall on / off | distinct choices |")
    print("|---|---:|---:|---:|---:|---:|")
    cases = [(name, n) for name in names for n in ns]
    for (name, n), off, on in zip(cases, runs["off"], runs["on"], strict=False):
        print(
            f"| {name} | {n} | {off.host_ms:.3f} / {on.host_ms:.3f} |"
            f" {off.wall:.2f} / {on.wall:.2f} | {on.wall / off.wall:.2f} |"
            f" {off.distinct} / {on.distinct} |",
            flush=True,
        )
    same = runs["off"][-1].texts == runs["on"][-1].texts
    print(f"\ngreedy, n=4 x {tokens}: {'the same text' if same else 'DIFFERENT text'} off and on")


def before_after_table(model: str, checkout: Path, ns: list[int], tokens: int, rounds: int) -> None:
    print(f"\n5. Before ({checkout}) and after (this tree), --backend-sampling on\n")
    cases = [(n, stream) for n in ns for stream in (False, True)]
    runs: dict[str, dict[tuple[int, bool], list[Served]]] = {"before": {}, "after": {}}
    with contextlib.ExitStack() as stack, httpx.Client(timeout=httpx.Timeout(3600.0)) as http:
        servers = {}
        for side, tree in (("before", checkout), ("after", None)):
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            own = ["--data-dir", str(tmp / "data"), "--cache-dir", str(tmp / "kv")]
            args = ("--model", model, "--backend-sampling", "on", *own)
            servers[side] = stack.enter_context(run_server(tmp, *args, checkout=tree))
        for turn in range(rounds):
            for n, stream in cases:
                body = {"prompt": STORY, "n": n, "n_predict": tokens, "seed": 1, "stream": stream}
                for side in ("before", "after") if turn % 2 == 0 else ("after", "before"):
                    time.sleep(0.5)  # llama.cpp's threads of the other server settle
                    run = served(servers[side], http, {**body, "ignore_eos": True}, stream)
                    runs[side].setdefault((n, stream), []).append(run)
    print("| n | answer | host ms / branch-step, before | after | after / before |", end="")
    print(" wall after / before | each, before / after |")
    print("|---:|---|---:|---:|---:|---:|---|")
    for case in cases:
        before, after = runs["before"][case], runs["after"][case]
        pairs = zip(before, after, strict=True)
        each = " ".join(f"{b.host_ms:.3f}/{a.host_ms:.3f}" for b, a in pairs)
        b, a = (statistics.median(r.host_ms for r in side) for side in (before, after))
        wall = statistics.median(r.wall for r in after) / statistics.median(r.wall for r in before)
        n, stream = case
        answer = "streamed" if stream else "whole"
        print(
            f"| {n} | {answer} | {b:.3f} | {a:.3f} | {a / b:.2f} | {wall:.2f} | {each} |",
            flush=True,
        )


def engine_table(
    model: Model,
    presets: dict[str, Any],
    names: list[str],
    ns: list[int],
    tokens: int,
    repeats: int,
) -> None:
    print("\n1. The engine (the server's step), backend sampling off / on\n")
    print("| preset | n | host ms / branch-step | logits bytes / branch-step |", end="")
    print(" decode ms / step | wall s | wall on / off |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in names:
        for n in ns:
            offs, ons = [], []
            for _ in range(repeats):  # alternated: the machine's drift hits both
                offs.append(engine_run(model, presets[name], n, tokens))
                ons.append(engine_run(model, presets[name], n, tokens, device=True))
            off, on = median_run(offs), median_run(ons)
            print(
                f"| {name} | {n} | {off.host_ms:.3f} / {on.host_ms:.3f} |"
                f" {off.bytes_per_step:,.0f} / {on.bytes_per_step:,.0f} |"
                f" {off.decode_ms:.1f} / {on.decode_ms:.1f} | {off.wall:.2f} / {on.wall:.2f} |"
                f" {on.wall / off.wall:.2f} |",
                flush=True,
            )


def loop_table(
    model: Model, presets: dict[str, Any], names: list[str], ns: list[int], tokens: int, k: int
) -> None:
    print(f"\n2. Sampling alone: host rows against llama.cpp's device top_k({k})\n")
    print("| preset | n | host: host ms / branch-step | device: host ms / branch-step |", end="")
    print(" host: bytes | device: bytes | decode ms host / device | wall s host / device |", end="")
    print(" same | undecided |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in names:
        params = request_params(model, presets[name], tokens)
        (probe,) = build_samplers(model, params, [1])
        fits = provable(probe, k)
        probe.close()
        for n in ns:
            h = sampling_loop(model, presets[name], n, tokens, k, device=False)
            if not fits:
                print(
                    f"| {name} | {n} | {h.host_ms:.3f} | (host path) | {h.bytes_per_step:,.0f} |"
                    f" | {h.decode_ms:.1f} / | {h.wall:.2f} / | | |",
                    flush=True,
                )
                continue
            d = sampling_loop(model, presets[name], n, tokens, k, device=True)
            same = sum(a == b for a, b in zip(h.tokens, d.tokens, strict=True))
            print(
                f"| {name} | {n} | {h.host_ms:.3f} | {d.host_ms:.3f} | {h.bytes_per_step:,.0f} |"
                f" {d.bytes_per_step:,.0f} | {h.decode_ms:.1f} / {d.decode_ms:.1f} |"
                f" {h.wall:.2f} / {d.wall:.2f} | {same}/{n} | {d.undecided} |",
                flush=True,
            )


def attach_table(model: Model, k: int) -> None:
    print("\n3. Attaching the device chain to every sequence\n")
    print("| sequences | a 1-token decode ms | llama_set_sampler ×n ms | first decode after ms |")
    print("|---:|---:|---:|---:|")
    for n_seq in (16, 128):
        plain, attach, first = attach_cost(model, n_seq, k)
        print(f"| {n_seq} | {plain * 1e3:.1f} | {attach * 1e3:.1f} | {first * 1e3:.1f} |")


if __name__ == "__main__":
    main()
