"""Two replicas behind deploy/nginx.conf, run as shipped (only its ports replaced): SSE
passes through unbuffered, a writer's session stays on one replica and keeps its cache,
and a replica that dies costs only the requests it was running."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.bundled import GEMMA
from tests.support.cluster import NGINX, RunningBalancer, run_balancer
from tests.support.server import RunningServer, run_server

# The default model only: what is tested here is nginx's routing of HTTP and SSE, the
# session affinity and the failover, none of which depends on the model behind it.
pytestmark = [
    pytest.mark.skipif(not Path(NGINX).exists(), reason="nginx is not installed"),
    pytest.mark.models(GEMMA),
]

STORY = (
    "The lighthouse keeper had kept the lamp for thirty years. Every night she climbed the"
    " hundred and twelve steps, trimmed the wick and wrote one line in the logbook. "
) * 6
SERVER_ARGS = ("--n-ctx", "4096", "--max-n", "4", "--max-sequences", "8")


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, bundled_model: str
) -> Iterator[tuple[RunningBalancer, list[RunningServer]]]:
    tmp = tmp_path_factory.mktemp("scale_out")
    args = ("--model", bundled_model, *SERVER_ARGS)
    with (
        run_server(tmp, *args) as first,
        run_server(tmp, *args) as second,
        run_balancer(tmp, [hostport(first), hostport(second)]) as balancer,
    ):
        yield balancer, [first, second]


def hostport(server: RunningServer) -> str:
    return server.base_url.removeprefix("http://")


def generated(server: RunningServer) -> float:
    return server.metric("llama_srb_generated_tokens_total")


def complete(balancer: RunningBalancer, session: str, prompt: str, **fields: object) -> dict:
    body = {"prompt": prompt, "max_tokens": 8, "n": 2, "seed": 1, **fields}
    response = httpx.post(
        f"{balancer.api_url}/completions",
        json=body,
        headers={"X-Session-Id": session},
        timeout=120,
    )
    assert response.status_code == 200, response.text
    return response.json()


def test_events_pass_through_while_the_replica_still_generates(
    cluster: tuple[RunningBalancer, list[RunningServer]],
) -> None:
    balancer, replicas = cluster
    body = {"prompt": STORY, "max_tokens": 64, "n": 2, "stream": True, "ignore_eos": True}
    with httpx.stream(
        "POST", f"{balancer.api_url}/completions", json=body, timeout=120
    ) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        assert json.loads(first.removeprefix("data: "))["choices"][0]["index"] in (0, 1)
        # Unbuffered: the first event arrived while its request is still running.
        assert sum(r.metric("llama_srb_requests_running") for r in replicas) == 1
        events = [line for line in lines if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"


def test_a_session_stays_on_one_replica_and_keeps_its_cache(
    cluster: tuple[RunningBalancer, list[RunningServer]],
) -> None:
    balancer, replicas = cluster
    before = [generated(r) for r in replicas]
    root = complete(balancer, "story-1", STORY)
    text = STORY + root["choices"][0]["text"]
    child = complete(balancer, "story-1", text)
    again = complete(balancer, "story-1", text + child["choices"][1]["text"])
    grew = [generated(r) - b for r, b in zip(replicas, before, strict=True)]
    assert sorted(grew) == [0, 3 * 2 * 8], grew  # every token on one replica
    for step in (child, again):
        usage = step["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] >= usage["prompt_tokens"] - 1


def test_sessions_spread_over_the_replicas(
    cluster: tuple[RunningBalancer, list[RunningServer]],
) -> None:
    balancer, replicas = cluster
    before = [generated(r) for r in replicas]
    for i in range(16):
        complete(balancer, f"writer-{i}", f"Story {i}: the keeper", max_tokens=1, n=1)
    grew = [generated(r) - b for r, b in zip(replicas, before, strict=True)]
    assert sum(grew) == 16 and min(grew) > 0, grew


def test_a_dead_replica_fails_only_its_running_requests(
    cluster: tuple[RunningBalancer, list[RunningServer]],
) -> None:
    """Runs last in this module: it kills a replica."""
    balancer, replicas = cluster
    before = [generated(r) for r in replicas]
    complete(balancer, "story-2", STORY, max_tokens=1, n=1)
    holder = next(r for r, b in zip(replicas, before, strict=True) if generated(r) > b)
    body = {"prompt": STORY, "max_tokens": 1000, "n": 2, "stream": True, "ignore_eos": True}
    headers = {"X-Session-Id": "story-2"}
    with httpx.stream(
        "POST", f"{balancer.api_url}/completions", json=body, headers=headers, timeout=120
    ) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        next(line for line in lines if line.startswith("data: "))
        holder.process.kill()
        holder.process.wait()
        with pytest.raises(httpx.HTTPError):  # the stream is cut, never ended as complete
            for line in lines:
                assert line != "data: [DONE]"
    after = complete(balancer, "story-2", STORY + " The next morning", max_tokens=4)
    assert len(after["choices"]) == 2
