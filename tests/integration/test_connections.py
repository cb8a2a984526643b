"""Connection limits through the real server, with raw sockets: connections that send
nothing, headers a line at a time (slowloris) or stay idle after a response are cut by the
timeouts; a flood of them from one address displaces its own oldest, never a request in
progress, and others are served all along.

The default model only: what is tested is the HTTP layer.
"""

from __future__ import annotations

import select
import socket
from collections.abc import Iterator

import httpx
import pytest

from tests.integration.bundled import GEMMA
from tests.integration.test_hardening import LONG, Stream, wait_for
from tests.support.server import RunningServer, run_server

pytestmark = pytest.mark.models(GEMMA)

HEADER_TIMEOUT = 2
IDLE_TIMEOUT = 2
PER_CLIENT = 8


@pytest.fixture(scope="module")
def limited(
    tmp_path_factory: pytest.TempPathFactory, bundled_model: str
) -> Iterator[RunningServer]:
    args = ("--model", bundled_model, "--n-ctx", "4096", "--max-sequences", "16", "--max-n", "4")
    limits = (
        *("--header-timeout", str(HEADER_TIMEOUT), "--idle-timeout", str(IDLE_TIMEOUT)),
        *("--max-connections-per-client", str(PER_CLIENT), "--max-connections", "500"),
    )
    with run_server(tmp_path_factory.mktemp("limited"), *args, *limits) as running:
        yield running


def connect(server: RunningServer) -> socket.socket:
    port = int(server.base_url.rsplit(":", 1)[1])
    return socket.create_connection(("127.0.0.1", port), timeout=60)


def read_to_end(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def closed(sock: socket.socket) -> bool:
    """Whether the server has closed it or is closing it (it sends nothing else before a
    request), without waiting."""
    return bool(select.select([sock], [], [], 0)[0])


def cut(server: RunningServer, reason: str) -> float:
    return server.metric(f'llama_srb_connections_cut_total{{reason="{reason}"}}')


def healthy(server: RunningServer) -> bool:
    return httpx.get(f"{server.base_url}/health", timeout=30).status_code == 200


def test_a_connection_that_never_sends_a_request_is_cut(limited: RunningServer) -> None:
    before = cut(limited, "header_timeout")
    with connect(limited) as sock:
        assert read_to_end(sock) == b""  # closed quietly: it had sent nothing
    assert cut(limited, "header_timeout") == before + 1


def test_headers_sent_a_line_at_a_time_are_cut_with_a_408(limited: RunningServer) -> None:
    with connect(limited) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        # One more header line every half second, never the end, for up to 30 s (15 times
        # the header timeout): no line may count as progress.
        for line in range(60):
            if select.select([sock], [], [], 0.5)[0]:
                break
            sock.sendall(f"X-Slow-{line}: 1\r\n".encode())
        response = read_to_end(sock)
    assert response.startswith(b"HTTP/1.1 408 ") and b"--header-timeout" in response


def test_a_keep_alive_connection_idle_after_a_response_is_cut(limited: RunningServer) -> None:
    before = cut(limited, "idle_timeout")
    with connect(limited) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        response = read_to_end(sock)  # the response, then the close once idle
    assert response.startswith(b"HTTP/1.1 200 ") and b'"status":"ok"' in response
    assert cut(limited, "idle_timeout") == before + 1


def test_a_flood_of_idle_and_slow_connections_displaces_only_its_own_oldest(
    limited: RunningServer,
) -> None:
    """300 idle connections and 200 slowloris ones from one address: at most
    --max-connections-per-client stay open at a time, a stream in progress on that address
    is never among those cut, and requests keep being served throughout."""
    stream = Stream(limited, LONG).started()
    before = cut(limited, "displaced") + cut(limited, "header_timeout")
    flood: list[socket.socket] = []
    try:
        for i in range(500):
            sock = connect(limited)
            if i % 5 < 2:  # two in five: a slowloris, its headers begun
                sock.sendall(b"GET /health HTTP/1.1\r\n")
            flood.append(sock)
            if i % 100 == 99:
                assert healthy(limited)
        # Each is displaced by a later one or, the last few, cut by the header timeout.
        wait_for(
            lambda: (
                cut(limited, "displaced") + cut(limited, "header_timeout")
                >= before + 500 - PER_CLIENT
            )
        )
        open_now = sum(not closed(sock) for sock in flood)
        assert open_now <= PER_CLIENT
        assert stream.ended_at is None and stream.error is None  # its connection survived
        assert limited.metric("llama_srb_connections_open") <= PER_CLIENT + 1
    finally:
        for sock in flood:
            sock.close()
        stream.hang_up.set()
    stream.join(60)
    assert stream.error is None


def test_a_new_connection_is_refused_only_when_every_one_is_busy(limited: RunningServer) -> None:
    streams = [Stream(limited, {**LONG, "max_tokens": 400}) for _ in range(PER_CLIENT)]
    for stream in streams:
        stream.start()
    try:
        wait_for(lambda: all(s.status == 200 for s in streams))
        with connect(limited) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            response = read_to_end(sock)
        assert response.startswith(b"HTTP/1.1 503 ") and b"connection_limit" in response
    finally:
        for stream in streams:
            stream.hang_up.set()
    for stream in streams:
        stream.join(60)
    wait_for(lambda: healthy(limited))
