"""Where one /completion request's host time goes, stage by stage, outside llama_decode.

    .venv/bin/python bench/request_timeline.py [--n 8] [--tokens 1] [--requests 100]
                                               [--backend-sampling on] [--model gemma-3-270m]

The server runs in this process as `llama-srb serve` sets it up (uvicorn in a thread, its
connection limits, the request and access logs at INFO, into a file here, `gc.freeze`
after start-up); the client is httpx, in the same process, one request at a time on one
connection. Each request is the same: the bench's story (bench_host.STORY), n x --tokens,
`ignore_eos`, seed 1, so its prompt is cached but for its last token, as a writer's swipe
is. Timestamps are taken at the entry and exit of a few functions along the way (wrapped
here, nothing in llama_srb changed), and each stage's time is its median over the
requests (the medians need not add up to the median wall exactly):

- http in: the client sends, until the route hands its preparation to a worker thread
  (uvicorn, the middleware, FastAPI's routing and body validation);
- preparation: on the worker thread (the prompt's tokens, the sampling parameters, each
  branch's sampler chain), until the event loop has it back;
- to the first decode: submission, the engine's admission (prefix match, forks), its
  first batch;
- llama_decode: every call's time, added up;
- between decodes: the engine's steps between two decodes (sampling the rows, the
  branches' text and stops, the next batch), added up;
- after the last decode: until its outputs are posted to the event loop (the last
  sampling, retiring the request, parking its paths);
- hand-over: until the event loop delivers them;
- answer out: until the response's last bytes are handed to the socket (the request
  log, rendering the JSON);
- http back: until the client has the response.

With `--step-detail`, it also times 16 functions of the engine's step, and prints what
the time between two decodes goes to: the time from each stamp to the next (`a> -> b<`),
summed over a request's steps and divided by them, the median over the requests.

The bench's own wrappers cost each stage a microsecond or two.
"""

from __future__ import annotations

import argparse
import functools
import gc
import inspect
import itertools
import logging
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import uvicorn
import uvicorn.protocols.http.h11_impl as h11_impl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_host import STORY
from llama_srb.api import workers
from llama_srb.api.app import create_app
from llama_srb.api.connections import limited_protocol
from llama_srb.bundled_model import DEFAULT
from llama_srb.config import Settings
from llama_srb.engine import device_cut, engine, runtime, sampling_stage, scheduler
from llama_srb.native import Context
from tests.support.server import free_port

Events = list[tuple[str, float]]
EVENTS: Events = []  # (label, perf_counter), appended from every thread (list.append: atomic)


def stamp(owner: object, name: str, label: str) -> None:
    """Record `label>` and `label<` around every call of owner.name (a coroutine function's
    around its await)."""
    fn: Callable[..., Any] = getattr(owner, name)
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def timed_async(*args: Any, **kwargs: Any) -> Any:
            EVENTS.append((f"{label}>", time.perf_counter()))
            try:
                return await fn(*args, **kwargs)
            finally:
                EVENTS.append((f"{label}<", time.perf_counter()))

        setattr(owner, name, timed_async)
        return

    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        EVENTS.append((f"{label}>", time.perf_counter()))
        try:
            return fn(*args, **kwargs)
        finally:
            EVENTS.append((f"{label}<", time.perf_counter()))

    setattr(owner, name, timed)


STEP_FUNCTIONS = (
    (device_cut.DeviceCut, "plan"),
    (device_cut.DeviceCut, "read"),
    (device_cut.DeviceCut, "pick"),
    (sampling_stage.SamplingStage, "run"),
    (scheduler.Scheduler, "schedule"),
    (scheduler.Scheduler, "prefilled"),
    (scheduler.Scheduler, "postprocess"),
    (engine.Engine, "step"),
    (engine.Engine, "_apply"),
    (engine.Engine, "_start_masks"),
    (engine.Engine, "_observe_gaps"),
    (runtime.Runtime, "_publish_step"),
    (runtime.Runtime, "_hand_over"),
)  # with Context.decode, Runtime._publish and _deliver: 16


def between_decodes(events: Events) -> dict[str, float]:
    """One request's time between decodes, by consecutive pair of stamps, per step."""
    spans: dict[str, float] = {}
    steps = 0
    start: int | None = None
    for i, (label, _) in enumerate(events):
        if label == "decode<":
            start = i
        elif label == "decode>" and start is not None:
            steps += 1
            for (a, at_a), (b, at_b) in itertools.pairwise(events[start : i + 1]):
                spans[f"{a} -> {b}"] = spans.get(f"{a} -> {b}", 0.0) + at_b - at_a
    return {pair: seconds / steps for pair, seconds in spans.items()} if steps else {}


def stages(events: Events, sent: float, received: float) -> dict[str, float]:
    """One request's stages, in seconds, from its events."""
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    decode = between = 0.0
    start = 0.0
    decode_end: float | None = None
    for label, at in events:
        first.setdefault(label, at)
        last[label] = at
        if label == "decode>":
            if decode_end is not None:
                between += at - decode_end
            start = at
        elif label == "decode<":
            decode += at - start
            decode_end = at
    return {
        "http in": first["prepare>"] - sent,
        "preparation": first["prepare<"] - first["prepare>"],
        "to the first decode": first["decode>"] - first["prepare<"],
        "llama_decode": decode,
        "between decodes": between,
        "after the last decode": last["publish>"] - last["decode<"],
        "hand-over": last["deliver>"] - last["publish>"],
        "answer out": last["send<"] - last["deliver>"],
        "http back": received - last["send<"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=1)
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--backend-sampling", default="on", choices=("auto", "on", "off"))
    parser.add_argument("--model", default=DEFAULT)
    parser.add_argument("--step-detail", action="store_true")
    args = parser.parse_args()

    stamp(workers.Workers, "run", "prepare")
    stamp(Context, "decode", "decode")
    stamp(runtime.Runtime, "_publish", "publish")
    stamp(runtime.Runtime, "_deliver", "deliver")
    stamp(h11_impl.RequestResponseCycle, "send", "send")
    for owner, name in STEP_FUNCTIONS if args.step_detail else ():
        stamp(owner, name, name.strip("_"))

    with tempfile.TemporaryDirectory() as tmp:
        logging.basicConfig(
            level="INFO",
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
            filename=Path(tmp) / "server.log",
        )
        port = free_port()
        settings = Settings(
            port=port,
            model=args.model,
            backend_sampling=args.backend_sampling,
            data_dir=Path(tmp) / "data",
            cache_dir=Path(tmp) / "kv",
        )
        app = create_app(settings)
        config = uvicorn.Config(
            app,
            port=port,
            log_level="info",
            log_config=None,  # uvicorn's access log into the file above, as the server's
            http=limited_protocol(app.state.srb.connections),
        )
        server = uvicorn.Server(config)
        threading.Thread(target=server.run, daemon=True).start()
        url = f"http://127.0.0.1:{port}"
        while not server.started or httpx.get(f"{url}/health", timeout=30).status_code != 200:
            time.sleep(0.2)
        gc.freeze()

        body = {
            "prompt": STORY,
            "n": args.n,
            "n_predict": args.tokens,
            "ignore_eos": True,
            "seed": 1,
        }
        runs: list[dict[str, float]] = []
        details: list[dict[str, float]] = []
        walls: list[float] = []
        with httpx.Client(base_url=url, timeout=600) as client:
            for i in range(args.requests + 3):  # the first 3 warm up
                EVENTS.clear()
                sent = time.perf_counter()
                client.post("/completion", json=body).raise_for_status()
                received = time.perf_counter()
                if i >= 3:
                    runs.append(stages(events := list(EVENTS), sent, received))
                    details.append(between_decodes(events))
                    walls.append(received - sent)
        server.should_exit = True

    branch_steps = args.n * args.tokens
    wall = statistics.median(walls)
    print(f"One /completion of n={args.n} x {args.tokens} tokens (its prompt cached but the")
    print(f"last token), --backend-sampling {args.backend_sampling}, {args.model}: the median")
    print(f"over {args.requests} requests, one at a time; the wall's median {wall * 1e3:.2f} ms\n")
    print("| stage | ms | ms per branch-step |")
    print("|---|---:|---:|")
    host = 0.0
    for name in runs[0]:
        ms = statistics.median(run[name] for run in runs) * 1e3
        host += 0 if name == "llama_decode" else ms
        print(f"| {name} | {ms:.2f} | {ms / branch_steps:.4f} |")
    print(f"| **outside llama_decode** | **{host:.2f}** | **{host / branch_steps:.4f}** |")
    if args.step_detail and args.tokens > 1:
        print("\nBetween two decodes, ms a step, from each stamp to the next (> entry, < exit)\n")
        print("| from -> to | ms |")
        print("|---|---:|")
        pairs = {pair for detail in details for pair in detail}
        medians = {p: statistics.median(d.get(p, 0.0) for d in details) for p in pairs}
        for pair, seconds in sorted(medians.items(), key=lambda item: -item[1]):
            print(f"| {pair} | {seconds * 1e3:.3f} |")
    print(
        f"\nreproduce: .venv/bin/python bench/request_timeline.py --n {args.n}"
        f" --tokens {args.tokens} --requests {args.requests}"
        f" --backend-sampling {args.backend_sampling} --model {args.model}"
        + (" --step-detail" if args.step_detail else "")
    )


if __name__ == "__main__":
    main()
