"""How outputs cross from the engine thread to the event loop (engine/runtime.py,
engine/mailbox.py), over a fake context: a step's progress goes when the next decode
starts and ahead of anything published after it; the mailbox runs what any thread posts,
in order, on its event loop."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from typing import Any

import pytest

from llama_srb.engine.build import Submission
from llama_srb.engine.mailbox import Mailbox
from llama_srb.engine.outputs import FinishReason
from llama_srb.engine.runtime import Runtime
from tests.unit.fake_context import BOS, expected, make_engine, make_request

PROMPT = [BOS, *(2 + i % 26 for i in range(39))]  # each test has an engine of its own


def test_a_steps_progress_is_posted_once_the_next_step_is_planned_right_before_its_decode() -> None:
    """The engine thread's order of events: the next step's plan, then the last step's
    progress, then llama_decode (before: the progress went before the plan, and the event
    loop's reading of it ran between the two decodes)."""
    engine, ctx = make_engine()
    runtime = Runtime(engine)
    events: list[str] = []
    schedule, decode, post = engine.scheduler.schedule, ctx.decode, runtime._mailbox.post

    def planned() -> Any:
        events.append("plan")
        return schedule()

    def decoding(batch: Any) -> None:
        events.append("decode")
        decode(batch)

    def posted(callback: Callable[[], None]) -> None:
        events.append("post")
        post(callback)

    engine.scheduler.schedule = planned  # type: ignore[method-assign]
    ctx.decode = decoding  # type: ignore[method-assign]
    runtime._mailbox.post = posted  # type: ignore[method-assign]
    prompt = PROMPT

    async def scenario() -> list[int]:
        runtime.start()
        events.clear()  # the warm-up's decode
        try:
            tokens: list[int] = []
            request = make_request("a", prompt, max_tokens=6)
            async for output in runtime.generate(Submission(request)):
                tokens += [t for choice in output.choices for t in choice.token_ids]
            return tokens
        finally:
            runtime.stop()

    assert asyncio.run(scenario()) == expected(prompt, 0, 6)
    decodes = events.count("decode")
    assert decodes >= 6
    # the first step has nothing before it to post; the last one's end goes at once
    steps = ["plan", "decode"] + ["plan", "post", "decode"] * (decodes - 1) + ["post"]
    assert events == steps


def test_what_is_published_after_a_step_goes_after_that_steps_progress() -> None:
    """An abort between two steps ends the request while the last step's progress waits
    for a decode that will not come: the progress goes first, so the reader has every
    token its branch drew (after the ending, a reader reads nothing)."""
    engine, ctx = make_engine()
    runtime = Runtime(engine)
    request = make_request("a", PROMPT, max_tokens=50)
    decode, decodes = ctx.decode, [0]

    def aborting_after_three(batch: Any) -> None:
        decode(batch)
        decodes[0] += 1
        if decodes[0] == 1 + 3:  # the warm-up's, then the request's third
            runtime.abort("a")  # runs on the engine thread after this step

    ctx.decode = aborting_after_three  # type: ignore[method-assign]

    async def scenario() -> tuple[list[int], FinishReason | None]:
        runtime.start()
        try:
            tokens: list[int] = []
            reason = None
            async for output in runtime.generate(Submission(request)):
                for choice in output.choices:
                    tokens += choice.token_ids
                    reason = choice.finish_reason or reason
            return tokens, reason
        finally:
            runtime.stop()

    tokens, reason = asyncio.run(scenario())
    assert reason is FinishReason.ABORT
    assert len(tokens) == 3 and tokens == request.branches[0].tokens


def test_the_mailbox_runs_what_threads_post_in_order_on_its_event_loop() -> None:
    mailbox = Mailbox()
    ran: list[tuple[int, int, bool]] = []

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        mailbox.watch(loop)
        loop_thread = threading.get_ident()
        done = asyncio.Event()

        def poster(which: int) -> None:
            for i in range(200):
                mailbox.post(
                    lambda i=i: ran.append((which, i, threading.get_ident() == loop_thread))
                )
            mailbox.post(lambda: loop.call_soon(done.set) if which == 1 else None)

        threads = [threading.Thread(target=poster, args=(w,)) for w in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        await asyncio.wait_for(done.wait(), 10)
        await asyncio.sleep(0.05)  # the other thread's last ones, had they come later

    asyncio.run(scenario())
    assert all(on_loop for *_, on_loop in ran)
    for which in range(2):
        assert [i for w, i, _ in ran if w == which] == list(range(200))


def test_closing_the_mailbox_runs_what_was_posted_and_closes_its_pipe_once() -> None:
    mailbox = Mailbox()
    ran: list[int] = []

    async def scenario() -> None:
        mailbox.watch(asyncio.get_running_loop())
        mailbox.post(lambda: ran.append(1))  # not read yet: the loop has not run since
        mailbox.close()
        mailbox.close()

    asyncio.run(scenario())
    assert ran == [1]
    for fd in (mailbox._read_fd, mailbox._write_fd):
        with pytest.raises(OSError):
            os.fstat(fd)
