"""The connection caps' bookkeeping (api/connections.py) without a server: who is displaced
over a cap, who is refused, and which addresses count only in the total. The protocol
itself is tested against the real server (tests/integration/test_connections.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llama_srb.api.connections import ConnectionLimits, OpenConnections, networks


@dataclass(eq=False)
class Conn:
    address: str
    waiting_since: float | None  # None: serving a request
    reason: str | None = None

    def cut(self, reason: str) -> None:
        self.reason = reason


def opened(connections: OpenConnections, *conns: Conn) -> list[bool]:
    admitted = []
    for conn in conns:
        fake: Any = conn
        admitted.append(connections.admit(fake))
    return admitted


def test_over_the_per_address_cap_its_longest_waiting_connection_goes() -> None:
    connections = OpenConnections(ConnectionLimits(20, max_connections=10, max_per_address=2))
    busy, idle, newer = Conn("a", None), Conn("a", 1.0), Conn("a", 2.0)
    assert opened(connections, busy, idle, Conn("b", 0.5), newer) == [True, True, True, True]
    assert idle.reason == "displaced" and busy.reason is None  # never a request in progress
    assert connections.by_address["a"] == [busy, newer]


def test_a_new_connection_is_refused_only_when_every_one_is_busy() -> None:
    connections = OpenConnections(ConnectionLimits(20, max_connections=10, max_per_address=2))
    assert opened(connections, Conn("a", None), Conn("a", None), Conn("a", 3.0)) == [
        True,
        True,
        False,
    ]
    assert connections.total == 2


def test_the_total_cap_displaces_across_addresses() -> None:
    connections = OpenConnections(ConnectionLimits(20, max_connections=2, max_per_address=5))
    oldest = Conn("a", 1.0)
    assert opened(connections, oldest, Conn("b", None), Conn("c", 5.0)) == [True, True, True]
    assert oldest.reason == "displaced" and "a" not in connections.by_address


def test_a_trusted_proxy_counts_only_in_the_total() -> None:
    limits = ConnectionLimits(20, 100, max_per_address=1, exempt=networks(["10.0.0.0/8"]))
    connections = OpenConnections(limits)
    proxy = [Conn("10.1.2.3", None) for _ in range(5)]
    assert opened(connections, *proxy) == [True] * 5
    assert opened(connections, Conn("192.0.2.1", None), Conn("192.0.2.1", None)) == [True, False]
