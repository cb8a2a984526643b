"""Fair share between clients (engine/share.py), in the scheduler and over the fake
context: the queue by client, the reserve for small requests, per-client caps."""

from __future__ import annotations

from llama_srb.engine.kv import KvBudget, Shortage
from llama_srb.engine.outputs import ChoiceDelta
from llama_srb.engine.request import FinishReason, Request, RequestStatus
from llama_srb.engine.scheduler import Scheduler
from llama_srb.engine.share import ShareRules
from tests.unit.fake_context import (
    FakeModel,
    Outputs,
    bare_request,
    check_kv,
    make_engine,
    make_request,
)
from tests.unit.test_scheduler import until_decoding

_clock = iter(range(1_000_000))


def make(rid: str, client: str, n: int = 1, prompt_len: int = 4, max_tokens: int = 8) -> Request:
    """A request that arrived after every one made before it."""
    return bare_request(
        rid, list(range(prompt_len)), n, client, float(next(_clock)), max_tokens=max_tokens
    )


def scheduler(
    large_sequences: int = 8, n_cells: int = 1000, share: ShareRules | None = None
) -> Scheduler:
    """`large_sequences` for large requests; the reserve's sequences come on top."""
    rules = share or ShareRules()
    budget = KvBudget(large_sequences + rules.reserve_sequences, n_cells)
    return Scheduler(budget, n_batch=64, share=rules)


def admitted(s: Scheduler) -> list[str]:
    return [r.request_id for r in s.schedule().admitted]


def end(s: Scheduler, request: Request) -> None:
    s.end_request(request, FinishReason.STOP)


# -- the order of the queue -------------------------------------------------------------


def test_the_client_holding_fewer_sequences_goes_first_whatever_the_arrival() -> None:
    s = scheduler(large_sequences=4)
    heavy = make("heavy", "a", n=4)
    s.add(heavy)
    assert admitted(s) == ["heavy"]
    for request in (make("a2", "a", n=2), make("a3", "a", n=2), make("b1", "b", n=2)):
        s.add(request)
    assert admitted(s) == []  # the server is full
    end(s, heavy)
    # a has nothing running now either: b's later request is behind a's first ...
    assert admitted(s) == ["a2", "b1"]  # ... then b holds 0, a holds 2: b before a3
    assert [r.request_id for r in s.waiting] == ["a3"]


def test_each_clients_requests_keep_their_order() -> None:
    s = scheduler(large_sequences=4)
    wide = make("wide", "a", n=4)
    narrow = make("narrow", "a", n=1)
    s.add(make("run", "b", n=1))
    assert admitted(s) == ["run"]
    s.add(wide)
    s.add(narrow)
    # `wide` lacks a sequence; its client's next request waits behind it, though it fits.
    assert admitted(s) == []
    assert list(s.waiting) == [wide, narrow]


def test_a_waiting_large_request_is_not_overtaken_by_other_clients() -> None:
    s = scheduler(large_sequences=4)
    s.add(make("run", "a", n=3))
    assert admitted(s) == ["run"]
    s.add(make("big", "b", n=2))  # its turn (b holds nothing), one sequence short
    s.add(make("small", "c", n=1))  # would fit; no reserve to go into: it waits
    plan = s.schedule()
    assert plan.admitted == [] and plan.blocked is Shortage.SEQUENCES


def test_a_prompt_list_of_one_client_does_not_hold_back_anothers_request() -> None:
    s = scheduler(large_sequences=4)
    for i in range(6):
        s.add(make(f"list{i}", "a"))
    s.add(make("other", "b"))
    # a's list is admitted one by one until a holds more than b: then b's turn.
    assert admitted(s) == ["list0", "other", "list1", "list2"]


# -- the reserve ------------------------------------------------------------------------

RESERVE = ShareRules(reserve_sequences=2, reserve_cells=40)


def test_large_requests_leave_the_reserve_to_small_ones() -> None:
    s = scheduler(large_sequences=4, n_cells=200, share=RESERVE)
    heavy = make("heavy", "a", n=4, max_tokens=30)  # 124 cells: large
    s.add(heavy)
    s.add(make("heavy2", "b", n=3, max_tokens=10))  # large: no sequences left for it
    s.add(make("light", "c", n=1, max_tokens=16))  # 20 cells: small
    assert admitted(s) == ["heavy", "light"]
    assert s.budget.live == 5  # the reserve's sequence on top of the 4 large ones
    end(s, heavy)
    assert admitted(s) == ["heavy2"]


def test_a_large_request_may_not_use_the_reserves_cells() -> None:
    s = scheduler(large_sequences=8, n_cells=200, share=RESERVE)
    s.add(make("first", "a", n=2, max_tokens=50))  # 104 cells
    s.add(make("second", "b", n=1, max_tokens=60))  # 64 more: into the 40-cell reserve
    plan = s.schedule()
    assert [r.request_id for r in plan.admitted] == ["first"] and plan.blocked is Shortage.CELLS


def test_small_requests_pass_a_waiting_one_only_within_the_reserve() -> None:
    s = scheduler(large_sequences=4, n_cells=1000, share=RESERVE)
    s.add(make("heavy", "a", n=4))
    assert admitted(s) == ["heavy"]
    s.add(make("big", "b", n=3))  # its turn; no large sequences left
    for client in "cde":
        s.add(make(f"small-{client}", client, n=1))
    # Two fit in the reserve; the third waits with `big`.
    assert admitted(s) == ["small-c", "small-d"]
    assert [r.request_id for r in s.waiting] == ["big", "small-e"]


def test_a_request_too_large_for_beside_the_reserve_runs_alone() -> None:
    s = scheduler(large_sequences=4, n_cells=200, share=RESERVE)
    s.add(make("small", "a", n=1))
    assert admitted(s) == ["small"]
    whole = make("whole", "b", n=1, prompt_len=20, max_tokens=160)  # 180 of 200 cells
    s.add(whole)
    s.add(make("small2", "c", n=1))
    assert admitted(s) == []  # nothing passes it: the server drains for it
    end(s, s.running[0])
    assert admitted(s) == ["whole", "small2"]  # beside it, what still fits


def test_the_reserve_is_returned_when_a_small_request_ends() -> None:
    s = scheduler(large_sequences=4, n_cells=1000, share=RESERVE)
    s.add(make("heavy", "a", n=4))
    s.add(make("big", "b", n=4))
    s.add(make("small", "c", n=2))
    assert admitted(s) == ["heavy", "small"]
    s.add(make("small2", "d", n=1))
    assert admitted(s) == []  # the reserve is full
    end(s, s.running[1])
    assert admitted(s) == ["small2"]


# -- per-client caps ------------------------------------------------------------------------


def test_a_client_at_its_cap_waits_for_its_own_requests_and_others_go_on() -> None:
    s = scheduler(large_sequences=8, share=ShareRules(client_sequences=4))
    first = make("a1", "a", n=3)
    for request in (first, make("a2", "a", n=2), make("b1", "b", n=2)):
        s.add(request)
    assert admitted(s) == ["a1", "b1"]  # a2 would give `a` 5 sequences
    assert s.schedule().blocked is Shortage.SEQUENCES  # its client's share of them
    end(s, first)
    assert admitted(s) == ["a2"]


# -- the prompt share of a step -------------------------------------------------------------


def test_prompt_room_goes_first_to_the_client_holding_fewer_sequences() -> None:
    s = scheduler(large_sequences=8)
    story = make("story", "a", n=4, prompt_len=300)
    s.add(story)
    s.schedule()
    short = make("short", "b", n=1, prompt_len=10)
    s.add(short)
    plan = s.schedule()
    # Arrival order would give the 300-token prompt the whole batch again.
    assert [c.request.request_id for c in plan.prefill] == ["short", "story"]


# -- over the fake context: two clients, one heavy ------------------------------------------


def test_a_light_clients_first_token_comes_within_two_steps_beside_a_heavy_client() -> None:
    """Client `heavy` fills every large sequence with long requests, then client `light`
    sends a short one: its first token comes at the step after its arrival (its prompt is
    prefilled and sampled in one step), while heavy's branches go on decoding."""
    engine, _ = make_engine(
        n_ctx=4096,
        n_batch=64,
        max_live=8,
        share=ShareRules(client_sequences=8, reserve_sequences=2, reserve_cells=64),
    )
    outputs = Outputs()
    prompt = FakeModel.tokens("onceuponatime")
    heavy = [
        make_request(f"heavy{i}", prompt, n=4, client="heavy", max_tokens=200) for i in range(3)
    ]
    for request in heavy:
        engine.add(request)
    for _ in range(5):
        outputs.add(engine.step())
        check_kv(engine)
    assert [r.status for r in heavy] == [RequestStatus.DECODING] * 2 + [RequestStatus.WAITING]
    light = make_request("light", FakeModel.tokens("hi"), n=1, client="light", max_tokens=8)
    engine.add(light)
    outputs.add(engine.step())
    assert outputs.tokens("light")[0], "the light request's first token"
    for _ in range(8):
        outputs.add(engine.step())
        check_kv(engine)
    assert outputs.last("light").finished
    assert heavy[2].status is RequestStatus.WAITING  # heavy's own third waits for its first two
    assert all(len(outputs.tokens(r.request_id)[0]) > 8 for r in heavy[:2])


def test_without_a_reserve_the_light_request_waits_for_the_heavy_ones() -> None:
    """The same traffic under the rules off (strict order per client, no reserve): the
    light request waits until a heavy one ends, 200 steps on."""
    engine, _ = make_engine(n_ctx=4096, n_batch=64, max_live=8)
    outputs = Outputs()
    prompt = FakeModel.tokens("onceuponatime")
    for i in range(2):
        engine.add(make_request(f"heavy{i}", prompt, n=4, client="heavy", max_tokens=200))
    for _ in range(5):
        outputs.add(engine.step())
    engine.add(make_request("light", FakeModel.tokens("hi"), n=1, client="light", max_tokens=8))
    for _ in range(100):
        outputs.add(engine.step())
    assert not outputs.tokens("light")


def test_a_finished_branch_returns_its_sequence_to_the_reserve_and_its_cells_later() -> None:
    s = scheduler(large_sequences=2, n_cells=1000, share=RESERVE)
    s.add(make("heavy", "a", n=2, max_tokens=30))
    small = make("small", "b", n=2, max_tokens=16)  # 36 of the reserve's 40 cells
    s.add(small)
    assert admitted(s) == ["heavy", "small"]
    s.add(make("big", "c", n=2, max_tokens=30))  # waits for large sequences: only the reserve
    tiny = make("tiny", "d", n=1, prompt_len=1, max_tokens=3)  # 4 cells
    s.add(tiny)
    s.add(make("short", "e", n=1, max_tokens=8))  # 12 cells
    assert admitted(s) == []  # no sequence left in the reserve
    until_decoding(s, small)  # and none is admitted while the prompts are read
    assert [r.request_id for r in s.running] == ["heavy", "small"]
    s.postprocess([(small, [ChoiceDelta(0, finish_reason=FinishReason.STOP)])])
    assert admitted(s) == ["tiny"]  # a sequence is back; 36 + 4 cells fill the reserve
    s.postprocess([(small, [ChoiceDelta(1, finish_reason=FinishReason.STOP)])])
    assert admitted(s) == ["short"]  # `small` ended: its cells are back too


# -- sessions of one address (issue 38) ----------------------------------------------------

A = "address:10.0.0.1"
B = "address:10.0.0.2"


def session(address: str, name: str) -> str:
    return f"{address}/session:{name}"


def test_sessions_divide_their_address_share_they_do_not_multiply_it() -> None:
    """Ten session ids from one address hold what one client may (the cap counts the
    address), and another address still gets its turn first."""
    s = scheduler(large_sequences=16, share=ShareRules(client_sequences=4))
    for i in range(10):
        s.add(make(f"a{i}", session(A, str(i)), n=2))
    assert admitted(s) == ["a0", "a1"]  # 4 sequences: the address's cap
    s.add(make("b", B, n=2))
    assert admitted(s) == ["b"]
    assert sum(len(r.live) for r in s.running if r.client.startswith(A)) == 4


def test_the_turn_goes_by_address_then_by_session() -> None:
    s = scheduler(large_sequences=8)
    s.add(make("a-first", session(A, "1"), n=4))
    assert admitted(s) == ["a-first"]
    for request in (
        make("a-same", session(A, "1"), n=2),
        make("a-other", session(A, "2"), n=2),
        make("b", B, n=2),
    ):
        s.add(request)
    # B's address holds nothing: first; then A's session that holds nothing, before A's
    # first session (whose request came earlier); the server is then full.
    assert admitted(s) == ["b", "a-other"]


def first_token_step(heavy_clients: list[str]) -> int:
    """The step at which a light client's first token comes, while heavy requests from
    `heavy_clients` (one each, in turn) fill the server."""
    engine, _ = make_engine(
        n_ctx=4096,
        n_batch=64,
        max_live=8,
        share=ShareRules(client_sequences=8, reserve_sequences=2, reserve_cells=64),
    )
    outputs = Outputs()
    prompt = FakeModel.tokens("onceuponatime")
    for i in range(10):  # small requests (within the reserve's cells): it would take them
        client = heavy_clients[i % len(heavy_clients)]
        engine.add(make_request(f"heavy{i}", prompt, n=1, client=client, max_tokens=45))
    for _ in range(5):
        outputs.add(engine.step())
    engine.add(make_request("light", FakeModel.tokens("hi"), n=1, client=B, max_tokens=8))
    for step in range(1, 300):
        outputs.add(engine.step())
        check_kv(engine)
        if outputs.tokens("light").get(0):
            return step
    raise AssertionError("no first token for the light client")


def test_ten_session_ids_delay_another_client_no_more_than_one_does() -> None:
    """The issue's case, counted in steps: ten sessions of one address against one. Were
    each session a client of its own (as before), the ten would hold every sequence, the
    reserve's too, and the light request would wait for one of them to end."""
    one = first_token_step([session(A, "only")])
    ten = first_token_step([session(A, str(i)) for i in range(10)])
    assert ten == one == 1
    assert first_token_step([f"session:{i}" for i in range(10)]) > 30  # ten clients
