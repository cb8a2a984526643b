"""A fake llama.cpp context for engine tests: no model, logits from a table.

It keeps a KV cache the way llama.cpp's unified cache does (cells holding a position and a
token, tagged with the sequence ids that share them: `seq_cp` tags, `seq_rm` untags), and
computes each row of logits from the tokens its sequence holds at positions 0..pos. So a
wrong fork, a missed copy or a cell released too early changes what the engine samples,
and `check_kv` compares the engine's books with the cells actually held.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from llama_srb.api.input.chat import ServedTemplate
from llama_srb.api.state import AppState
from llama_srb.config import Settings
from llama_srb.engine.engine import Engine
from llama_srb.engine.kv import KvBudget
from llama_srb.engine.outputs import RequestOutput, RequestTimes
from llama_srb.engine.prefix_index import SourceKind
from llama_srb.engine.request import Branch, Request, RequestStatus
from llama_srb.engine.runtime import Runtime
from llama_srb.engine.share import ShareRules
from llama_srb.engine.spec import RequestSpec
from llama_srb.engine.tiers import TierStore
from llama_srb.engine.watch import Watchdog
from llama_srb.native import Batch, DecodeError, NativeError
from llama_srb.sampling.cut import Ids, Row
from llama_srb.sampling.device_row import DeviceRow
from llama_srb.sampling.params import SamplingParams
from llama_srb.sampling.text import TextStream
from llama_srb.served import Served

N_VOCAB = 28
EOS = 0  # the only end-of-generation token
BOS = 1  # silent, as Gemma's <bos>
LETTERS = range(2, N_VOCAB)  # token t spells chr(ord("a") + t - 2)


class FakeModel:
    """The engine's vocabulary (engine/context.py) and what the API reads of a model
    (served.py `Tokenizer`): 26 letters, a BOS and an EOS."""

    n_vocab = N_VOCAB
    bos = BOS
    eos = EOS
    add_bos = True
    eog_tokens = (EOS,)

    @staticmethod
    def piece(token: int) -> bytes:
        return b"" if token < 2 else bytes([ord("a") + token - 2])

    @staticmethod
    def tokens(text: str) -> list[int]:
        return [ord(c) - ord("a") + 2 for c in text]

    # -- what the routes read of a model (api/input/prompts.py) ------------------------

    def tokenize(
        self, text: str, add_special: bool = True, parse_special: bool = True
    ) -> list[int]:
        letters = [c for c in text.lower() if "a" <= c <= chr(ord("a") + len(LETTERS) - 1)]
        return [BOS] * add_special + self.tokens("".join(letters))

    def text(self, tokens: Sequence[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode()

    def vocab_error(self, tokens: Sequence[int]) -> str | None:
        bad = next((t for t in tokens if not 0 <= t < N_VOCAB), None)
        return None if bad is None else f"token id {bad} is not in the vocabulary"

    def spells_special(self, text: str) -> bool:
        return False  # its tokenizer reads no text as a special token

    def special_piece(self, token: int) -> bytes:
        return {BOS: b"<bos>", EOS: b"<eos>"}.get(token, self.piece(token))

    def special_text(self, token: int) -> str:
        return self.special_piece(token).decode() if token >= 0 else ""

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.special_piece(t) for t in tokens).decode()


def ranking(history: Sequence[int]) -> list[int]:
    """The table the fake's logits come from: every letter, most likely first, as a
    function of the whole history (so a sequence holding the wrong cells samples wrong).
    End-of-generation comes after every letter (BOS last); `Ends` tables put it first."""
    key = sum((i + 1) * t for i, t in enumerate(history[-8:])) + len(history)
    start = key % len(LETTERS)
    letters = list(LETTERS)
    return [*letters[start:], *letters[:start], EOS, BOS]


Table = Callable[[Sequence[int]], list[int]]


@dataclass
class Ends:
    """A table whose end-of-generation token comes first after `after` generated tokens."""

    prompt_len: int
    after: int

    def __call__(self, history: Sequence[int]) -> list[int]:
        order = ranking(history)
        if len(history) - self.prompt_len >= self.after:
            order.remove(EOS)
            order.insert(0, EOS)
        return order


def row_for(history: Sequence[int], table: Table = ranking) -> npt.NDArray[np.float32]:
    row = np.empty(N_VOCAB, dtype=np.float32)
    row[table(history)] = -np.arange(N_VOCAB, dtype=np.float32)  # best 0, then -1, -2, ...
    return row


@dataclass(eq=False)
class Cell:
    pos: int
    token: int
    seqs: set[int] = field(default_factory=set)


class FakeContext:
    """Satisfies engine.context.DecodeContext; `ptr` is itself (what FakeSampler reads)."""

    def __init__(
        self,
        n_ctx: int,
        n_batch: int,
        n_seq_max: int,
        table: Table = ranking,
        device_top_k: int = 0,
        chained: int = 0,
    ) -> None:
        """`device_top_k`, `chained`: backend sampling as llama.cpp does it: sequences
        below `chained` carry a top-k chain, whose rows have candidates; a decode copies
        whole rows only when one of its rows is of a sequence without a chain (the rows
        read otherwise are stale: NaN here)."""
        self.n_ctx, self.n_batch, self.n_seq_max = n_ctx, n_batch, n_seq_max
        self.table = table
        self.device_top_k, self.chained = device_top_k, chained
        # each output row's candidates (ids, logits), least likely first (llama.cpp
        # gives them in no promised order)
        self.cut: list[tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]] | None] = []
        self.whole_decodes = 0  # decodes that copied their rows out
        self.seqs_decoded: set[int] = set()  # every sequence id a decode carried
        self.cells: list[Cell] = []
        self.rows: list[npt.NDArray[np.float32]] = []  # the last decode's, in batch order
        self._logits: npt.NDArray[np.float32] | None = None
        self.fail_next: int | None = None  # a DecodeError code for the next decode
        self.decoded = 0  # tokens computed by all decodes
        self.calls = 0  # decodes
        self.refuse_state = False  # state_set fails, as llama.cpp on bytes it cannot read

    def warm_up(self, token: int) -> None:
        # llama.cpp aborts the process on a token outside the vocabulary.
        assert 0 <= token < N_VOCAB, f"warm-up with invalid token {token}"
        self.warmed_with = token

    def decode(self, batch: Batch) -> None:
        self.rows, self._logits = [], None  # as llama.cpp: a decode replaces the last logits
        self.cut = []
        self.calls += 1
        if self.fail_next is not None:
            code, self.fail_next = self.fail_next, None
            raise DecodeError(code)
        struct = batch.struct
        n = batch.n_tokens
        if len(self.cells) + n > self.n_ctx:
            raise DecodeError(1)  # no KV slot, as llama.cpp says
        chainless = False
        for i in range(n):
            seq, pos = struct.seq_id[i][0], struct.pos[i]
            assert 0 <= seq < self.n_seq_max, f"seq id {seq} out of range"
            held = self.held(seq)
            self.seqs_decoded.add(seq)
            # llama.cpp requires each sequence's positions to continue where its cells end.
            assert pos == len(held), f"seq {seq}: token at {pos}, but it holds {len(held)}"
            self.cells.append(Cell(pos, struct.token[i], {seq}))
            if struct.logits[i]:
                row = row_for([*held, struct.token[i]], self.table)
                self.rows.append(row)
                chained = seq < self.chained and self.device_top_k > 0
                chainless |= not chained
                top = np.argsort(-row, kind="stable")[: self.device_top_k][::-1]
                self.cut.append((top, row[top]) if chained else None)
        if self.chained and not chainless:
            self.rows = [np.full(N_VOCAB, np.nan, np.float32) for _ in self.rows]
        self.whole_decodes += chainless and bool(self.rows)
        self.decoded += n

    def candidate_buffers(
        self, rows: Sequence[int], k: int
    ) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.float32], int]:
        if any(self.cut[i] is None for i in rows):
            raise NativeError("backend sampling: a row has no candidates")
        # as llama.cpp's buffers: a row of n_vocab per output row, its candidates first
        # (a row without a chain is left 0)
        ids = np.zeros((len(self.cut), N_VOCAB), np.int32)
        values = np.zeros((len(self.cut), N_VOCAB), np.float32)
        width = min(self.device_top_k, N_VOCAB)
        for i, cut in enumerate(self.cut):
            if cut is not None:
                ids[i, :width], values[i, :width] = cut
        return ids, values, min(k, width)

    def logits(self) -> npt.NDArray[np.float32]:
        if self._logits is None:  # one writable matrix per decode, as llama.cpp's buffer
            self._logits = np.stack(self.rows) if self.rows else np.empty((0, N_VOCAB), np.float32)
        return self._logits

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        lo, hi = max(p0, 0), p1 if p1 >= 0 else 1 << 62
        for cell in self.cells:
            if src in cell.seqs and lo <= cell.pos < hi:
                cell.seqs.add(dst)

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> None:
        lo, hi = max(p0, 0), p1 if p1 >= 0 else 1 << 62
        for cell in self.cells:
            if (seq_id < 0 or seq_id in cell.seqs) and lo <= cell.pos < hi:
                cell.seqs.discard(seq_id)
        self.cells = [c for c in self.cells if c.seqs]

    def seq_pos_max(self, seq_id: int) -> int:
        return len(self.held(seq_id)) - 1

    def state_get(self, seq_id: int) -> bytes:
        """A sequence's tokens, as llama.cpp's state holds its cells (`refuse` fails it)."""
        return np.asarray(self.held(seq_id), np.int32).tobytes()

    def state_set(self, seq_id: int, data: bytes) -> bool:
        assert not self.held(seq_id), f"restore into seq {seq_id}, which holds cells"
        if self.refuse_state or len(self.cells) + len(data) // 4 > self.n_ctx:
            return False
        tokens = np.frombuffer(data, np.int32)
        self.cells += [Cell(pos, int(t), {seq_id}) for pos, t in enumerate(tokens)]
        return True

    def held(self, seq: int) -> list[int]:
        """The tokens `seq` holds, by position; they must be 0..n-1 without a gap."""
        cells = sorted((c for c in self.cells if seq in c.seqs), key=lambda c: c.pos)
        assert [c.pos for c in cells] == list(range(len(cells))), f"seq {seq} has a gap"
        return [c.token for c in cells]


class FakeSampler:
    """Picks the `rank`-th most likely token (0: greedy) not forbidden (nor taken, for a
    distinct opening), so branches can differ."""

    matcher = None  # no grammar
    device_pick = None  # picks in Python: from a DeviceRow, as the engine's fallback does

    def __init__(self, rank: int = 0, device: bool = True) -> None:
        """`device`: a device's top-k may serve it (else it reads whole rows)."""
        self.rank = rank
        self.device_k = rank + 1 if device else None
        self.closed = 0
        self.accepted: list[int] = []

    def sample(
        self,
        row: Row | DeviceRow,
        forbidden: Ids | None = None,
        taken: set[int] | None = None,
        mask: object = None,
    ) -> int:
        if isinstance(row, DeviceRow):
            assert self.device_k is not None and not taken
            if forbidden is not None and len(forbidden):
                row.patch(np.asarray(forbidden), np.full(len(forbidden), -np.inf, np.float32))
            try:
                return int(row.top_k(self.device_k).ids[self.rank])
            finally:
                row.restore()
        values = row.logits.copy()
        if forbidden is not None:
            values[forbidden] = -np.inf
        order = [int(t) for t in np.argsort(-values, kind="stable")]
        return [t for t in order if t not in (taken or ())][self.rank]

    def accept(self, token: int) -> None:
        self.accepted.append(token)  # a token it did not draw: a steer's history, a writer's

    def picked_on_device(self) -> None:
        raise AssertionError("no C loop picks for a fake sampler")

    def close(self) -> None:
        self.closed += 1


def expected(prompt: list[int], rank: int, steps: int, table: Table = ranking) -> list[int]:
    """What a branch of `prompt` sampling the `rank`-th token generates alone."""
    history = list(prompt)
    for _ in range(steps):
        row = row_for(history, table)
        history.append(int(np.argsort(-row, kind="stable")[rank]))
    return history[len(prompt) :]


def bare_request(
    request_id: str,
    prompt: list[int],
    branches: list[Branch] | int = 1,
    client: str = "",
    arrival: float | None = None,
    **params: object,
) -> Request:
    """A request as the engine holds it (its spec, its branches: `n` without samplers)."""
    sampling = SamplingParams(**params)  # type: ignore[arg-type]
    if isinstance(branches, int):
        branches = [Branch(index=i) for i in range(branches)]
    spec = RequestSpec(prompt, sampling, len(branches), client=client)
    times = RequestTimes(time.monotonic() if arrival is None else arrival)
    return Request(request_id, spec, branches, times)


def make_request(
    request_id: str,
    prompt: list[int],
    n: int = 1,
    client: str = "",
    **params: object,
) -> Request:
    """A request whose branch i samples the i-th most likely token."""
    stop = SamplingParams(**params).stop  # type: ignore[arg-type]
    branches = [
        Branch(index=i, sampler=FakeSampler(i), text=TextStream(FakeModel.piece, stop))
        for i in range(n)
    ]
    return bare_request(request_id, prompt, branches, client, **params)


def make_engine(
    n_ctx: int = 1024,
    n_batch: int = 64,
    max_live: int = 8,
    cache_paths: int = 8,
    cache_cells: int | None = None,
    table: Table = ranking,
    tokens_per_call: int = 0,
    share: ShareRules | None = None,
    tiers: TierStore | None = None,
    device_top_k: int = 0,
    chained: int = 0,
) -> tuple[Engine, FakeContext]:
    """An engine over a fake context; the prefix cache may use every cell by default.
    `max_live` counts large requests' sequences; `share`'s reserve comes on top.
    `device_top_k`, `chained`: backend sampling (one sequence id more: its scratch)."""
    live = max_live + (share.reserve_sequences if share else 0)
    cells = n_ctx if cache_cells is None else cache_cells
    budget = KvBudget(live, n_ctx, cache_paths, cells, tiers)
    on = device_top_k > 0 and chained > 0
    ctx = FakeContext(n_ctx, n_batch, budget.n_seq + on, table, device_top_k, chained)
    engine = Engine(
        FakeModel(),
        ctx,
        budget,
        tokens_per_call=tokens_per_call,
        share=share,
        device_top_k=device_top_k,
        chained=chained,
    )
    return engine, ctx


def served(engine: Engine, runtime: Runtime, stuck_after: float = 0.0) -> Served:
    """What the API sees of an engine over a fake context and its runtime: the face the
    loader builds of a real one (loader.py), the fake model standing for llama.cpp's."""
    assert isinstance(engine.ctx, FakeContext)
    return Served(
        model=FakeModel(),  # type: ignore[arg-type]  # a Tokenizer; the builders run on it
        n_ctx=engine.ctx.n_ctx,
        runtime=runtime,
        snapshot=lambda: engine.snapshot,
        watchdog=Watchdog(engine.watch, stuck_after),
        close=lambda: runtime.stop(30),
    )


def loaded_state(settings: Settings, face: Served, chat: ServedTemplate | None = None) -> AppState:
    """The server's state with its default model loaded as `face`, through the models' own
    load (api/models.py), its loader handing over the face instead of reading a file."""
    state = AppState(settings, loader=lambda _: (face, chat or ServedTemplate("", "none")))
    load_default(state)
    return state


def load_default(state: AppState) -> None:
    """The default model's load, as the lifespan would start it: on a thread of its own,
    since the caller's may run an event loop already (a browser test's, earlier in the
    session)."""
    with ThreadPoolExecutor(1) as thread:
        thread.submit(asyncio.run, state.models.load(state.models.default)).result()


@dataclass
class Outputs:
    """Every output the engine returned, by request id."""

    by_request: dict[str, list[RequestOutput]] = field(default_factory=dict)

    def add(self, outputs: list[RequestOutput]) -> None:
        for output in outputs:
            got = self.by_request.setdefault(output.request_id, [])
            assert not (got and got[-1].finished), f"{output.request_id}: output after the last"
            got.append(output)

    def tokens(self, request_id: str) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for output in self.by_request.get(request_id, []):
            for choice in output.choices:
                out.setdefault(choice.index, []).extend(choice.token_ids)
        return out

    def text(self, request_id: str) -> dict[int, str]:
        out: dict[int, str] = {}
        for output in self.by_request.get(request_id, []):
            for choice in output.choices:
                out[choice.index] = out.get(choice.index, "") + choice.text
        return out

    def reasons(self, request_id: str) -> dict[int, str | None]:
        return {
            c.index: c.finish_reason
            for o in self.by_request.get(request_id, [])
            for c in o.choices
            if c.finish_reason is not None
        }

    def last(self, request_id: str) -> RequestOutput:
        return self.by_request[request_id][-1]


def run(engine: Engine, outputs: Outputs | None = None, max_steps: int = 10_000) -> Outputs:
    """Step until the engine has nothing left to do, checking the books after each step."""
    outputs = outputs or Outputs()
    for _ in range(max_steps):
        outputs.add(engine.step())
        check_kv(engine)
        if not engine.has_work:
            return outputs
    raise AssertionError("the engine never ran out of work")


def check_kv(engine: Engine) -> None:
    """The cells each sequence id holds are what the engine's books say they are."""
    ctx = engine.ctx
    assert isinstance(ctx, FakeContext)
    scheduler, budget = engine.scheduler, engine.scheduler.budget
    for path in budget.cache.paths:
        assert ctx.held(path.seq_id) == list(path.tokens), f"cached path {path.seq_id}"
    for request in scheduler.running:
        for seq in request.live:
            held, name = ctx.held(seq.seq_id), f"{request.request_id}#{seq.index}"
            if request.status is RequestStatus.DECODING:  # its newest token is decoded next
                newest = request.prompt_len + len(seq.tokens) - 1  # (a refill's: the prompt's)
                assert held == (request.prompt + seq.tokens)[:newest], name
            elif seq is request.primary:
                assert held == request.prompt[: request.n_prefilled], name
            else:
                assert held == [], name  # forked when the prompt is complete
    for seq_id, tokens in budget.kept_paths():  # ended branches whose cells stay a while
        assert ctx.held(seq_id) == tokens, f"kept path {seq_id}"
    for seq_id in budget.idle_seq_ids():
        assert not ctx.held(seq_id), f"free seq id {seq_id} holds cells"
    if engine.device is not None:  # backend sampling's scratch sequence is no one's
        assert not ctx.held(engine.device.scratch), "the scratch sequence holds cells"
    if not scheduler.running:  # nothing live: the cache's count of its cells is exact
        assert len(ctx.cells) == budget.cache.cells()
    assert len(ctx.cells) <= budget.cells_used
    # Every cell is counted once: the books are the cells held plus the room that running
    # requests reserved and have not filled yet (a restore reserves a whole entry: more).
    restoring = any(source.kind is SourceKind.TIER for source in budget.sources())
    if not restoring:
        unfilled = unfilled_room(scheduler.running)
        assert budget.cells_used == len(ctx.cells) + unfilled, "cells counted twice or never"


def unfilled_room(running: Sequence[Request]) -> int:
    """The KV cells running requests reserved and do not hold yet: the prompt they have
    still to read, and each live branch's tokens still to come."""
    room = 0
    for request in running:
        if request.status is RequestStatus.PREFILLING:
            room += request.prompt_len - request.n_prefilled
            room += len(request.live) * request.params.max_tokens
        else:  # a branch's newest token has no cell yet (a refill's: the prompt's last)
            room += sum(request.params.max_tokens + 1 - len(b.tokens) for b in request.live)
    return room
