"""The scheduler on its own, no context: admission, chunked prefill, the plan of a step.
Requests change state only through the scheduler's own calls, as the engine makes them
(add, schedule, prefilled after a decode, postprocess after sampling, end_request)."""

from llama_srb.engine.kv import KvBudget
from llama_srb.engine.outputs import ChoiceDelta
from llama_srb.engine.request import FinishReason, Request, RequestStatus
from llama_srb.engine.scheduler import Scheduler, StepPlan
from tests.unit.fake_context import bare_request


def make(rid: str, prompt_len: int, n: int = 1, max_tokens: int = 8) -> Request:
    return bare_request(rid, list(range(prompt_len)), n, max_tokens=max_tokens)


def scheduler(n_seq: int = 8, n_cells: int = 1000, n_batch: int = 64) -> Scheduler:
    return Scheduler(KvBudget(n_seq, n_cells), n_batch)


def computed(s: Scheduler, plan: StepPlan) -> StepPlan:
    """The plan's prompt chunks decoded: what the engine tells the scheduler after a step."""
    for call in plan.calls(0):
        s.prefilled(call)
    return plan


def until_decoding(s: Scheduler, request: Request, max_steps: int = 100) -> None:
    """Step (schedule, then the chunks computed) until `request`'s prompt is read."""
    for _ in range(max_steps):
        if request.status is RequestStatus.DECODING:
            return
        computed(s, s.schedule())
    raise AssertionError(f"{request.request_id} never finished its prompt")


def test_long_prompt_is_prefilled_in_chunks() -> None:
    s = scheduler(n_batch=64)
    r = make("a", 150)
    s.add(r)
    spans = []
    for _ in range(4):
        plan = computed(s, s.schedule())
        (chunk,) = plan.prefill
        spans.append((chunk.start, chunk.end))
    # The last token goes alone, as a decode step would take it (see _chunk_limit).
    assert spans == [(0, 64), (64, 128), (128, 149), (149, 150)]
    assert plan.prefill[0].completes_prompt
    assert r.n_prefilled == 150 and r.status is RequestStatus.DECODING


def decoding(s: Scheduler, n: int) -> Request:
    """A request of `n` branches, admitted and past its 4-token prompt."""
    running = make("run", 4, n=n)
    s.add(running)
    until_decoding(s, running)
    return running


def test_decode_tokens_of_running_requests_come_first_and_prefill_fills_the_rest() -> None:
    s = scheduler(n_batch=32)
    decoding(s, n=3)
    s.add(make("new", 100))
    plan = s.schedule()
    assert [seq.index for _, seq in plan.decode] == [0, 1, 2]
    assert plan.prefill[0].request.request_id == "new"
    assert plan.n_tokens == 32  # 3 decode tokens + a 29-token chunk
    assert not plan.prefill[0].completes_prompt


def test_beside_decoding_branches_a_prompt_ends_with_its_last_chunk() -> None:
    s = scheduler(n_batch=64)
    decoding(s, n=2)
    s.add(make("new", 20))
    (chunk,) = s.schedule().prefill
    # No step of its own for the last token: the batch is shared with decoding anyway.
    assert (chunk.start, chunk.end) == (0, 20) and chunk.completes_prompt


def test_admission_respects_sequence_ids_and_cells_in_arrival_order() -> None:
    s = scheduler(n_seq=4, n_cells=100)
    big = make("big", 10, n=3, max_tokens=10)  # 10 + 30 cells, 3 ids
    blocked = make("blocked", 10, n=2)  # needs 2 ids: only 1 left
    small = make("small", 1, n=1)  # would fit, but must not overtake
    for r in (big, blocked, small):
        s.add(r)
    s.schedule()
    assert [r.request_id for r in s.running] == ["big"]
    assert [r.request_id for r in s.waiting] == ["blocked", "small"]
    assert s.budget.cells_reserved == 40

    # A finished branch returns its id and cells; the queue moves on.
    s.postprocess([(big, [ChoiceDelta(2, finish_reason=FinishReason.STOP)])])
    assert big.branches[2].finished and big.branches[2].seq_id == -1
    s.schedule()
    assert [r.request_id for r in s.running] == ["big", "blocked"]


def test_removing_a_request_releases_everything() -> None:
    s = scheduler(n_seq=4, n_cells=100)
    r = make("a", 10, n=4, max_tokens=5)
    s.add(r)
    s.schedule()
    assert s.budget.free_ids == 0
    ops = s.end_request(r, FinishReason.ABORT)
    assert sorted(op.dst for op in ops if op.is_remove) == [0, 1, 2, 3]
    assert s.budget.free_ids == 4
    assert s.budget.cells_reserved == 0
    assert r.status is RequestStatus.FINISHED and not s.running


def test_a_request_that_can_never_fit_is_detected() -> None:
    budget = KvBudget(4, 100)
    assert not budget.fits_ever(make("too-long", 90, n=2, max_tokens=10))
    assert not budget.fits_ever(make("too-wide", 1, n=5))
    assert budget.fits_ever(make("ok", 80, n=2, max_tokens=10))
