"""Connection limits: uvicorn's h11 protocol with a header timeout and caps on open
connections, in total and per client address.

uvicorn closes a keep-alive connection that stays idle after a response
(`timeout_keep_alive`, our --idle-timeout), but nothing else: a connection that never
sends a request, or sends its headers a line every few seconds (slowloris), stays open
for ever. Here:

- A request's headers must be complete within `header_timeout` seconds of the moment the
  connection started waiting for them (when it opened, or when its first byte came after
  a response). Otherwise it is cut (408 if it had sent something).
- At most `max_connections` connections are open, and at most `max_per_address` from one
  address (proxies listed in --trusted-proxies count only in the total). A new connection
  over a cap first displaces the connection that has waited longest for a request (idle
  or still sending headers): those cost nothing to close and are what a flood is made
  of. Only when every connection is busy with a request is the new one refused (503).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from uvicorn.protocols.http.h11_impl import H11Protocol

from llama_srb.api.errors import error_body

log = logging.getLogger(__name__)

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
CUT_REASONS = ("header_timeout", "idle_timeout", "displaced", "refused")
REFUSED_LINGER_S = 2.0


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout: float
    max_connections: int
    max_per_address: int
    exempt: tuple[Network, ...] = ()  # addresses counted only in the total (proxies)

    def exempts(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in network for network in self.exempt)


def networks(addresses: Iterable[str]) -> tuple[Network, ...]:
    """IP addresses or CIDR ranges (127.0.0.1, 10.0.0.0/8) as networks."""
    return tuple(ipaddress.ip_network(a.strip(), strict=False) for a in addresses if a.strip())


@dataclass
class OpenConnections:
    """Every open connection of one server, by address (event-loop thread only)."""

    limits: ConnectionLimits
    by_address: dict[str, list[LimitedH11Protocol]] = field(default_factory=dict)
    cut: Counter[str] = field(default_factory=Counter)  # why connections were closed by us

    @property
    def total(self) -> int:
        return sum(len(c) for c in self.by_address.values())

    def admit(self, conn: LimitedH11Protocol) -> bool:
        """Count a new connection in, displacing waiting ones over a cap; False: refuse it."""
        limits, address = self.limits, conn.address
        mine = self.by_address.get(address, [])
        crowded = len(mine) >= limits.max_per_address and not limits.exempts(address)
        if crowded and not self._displace(mine):
            return False
        everyone = (c for conns in self.by_address.values() for c in conns)
        if self.total >= limits.max_connections and not self._displace(everyone):
            return False
        self.by_address.setdefault(address, []).append(conn)
        return True

    def remove(self, conn: LimitedH11Protocol) -> None:
        mine = self.by_address.get(conn.address)
        if mine is not None and conn in mine:
            mine.remove(conn)
            if not mine:
                del self.by_address[conn.address]

    def _displace(self, candidates: Iterable[LimitedH11Protocol]) -> bool:
        waiting = [c for c in candidates if c.waiting_since is not None]
        if not waiting:
            return False
        oldest = min(waiting, key=lambda c: c.waiting_since or 0.0)
        self.remove(oldest)
        oldest.cut("displaced")
        return True


def limited_protocol(connections: OpenConnections) -> type[H11Protocol]:
    """The protocol class for uvicorn.Config(http=...), bound to one server's connections."""
    return type("LimitedH11", (LimitedH11Protocol,), {"connections_open": connections})


class LimitedH11Protocol(H11Protocol):
    connections_open: ClassVar[OpenConnections]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.address = ""
        # When it began waiting for a request's headers; None while a request is served.
        self.waiting_since: float | None = None
        self._header_timer: asyncio.TimerHandle | None = None
        self._sent_bytes = False  # of the request it waits for
        self._refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.address = self.client[0] if self.client else ""
        self._await_request()
        if not self.connections_open.admit(self):
            self._refuse()
            return
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self.connections_open.remove(self)
        self._cancel_header_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # read and dropped, so that closing sends no reset over the 503
        if self.waiting_since is not None:
            self._sent_bytes = True
            if self._header_timer is None:  # a request begins after a response
                self.waiting_since = time.monotonic()
                self._arm_header_timer()
        cycle = self.cycle
        super().data_received(data)
        if self.cycle is not cycle:  # a request's headers are complete
            self.waiting_since = None
            self._cancel_header_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # arms uvicorn's keep-alive (idle) timer
        serving = self.cycle is not None and not self.cycle.response_complete  # pipelined
        if not serving and not self.transport.is_closing():
            self._await_request()

    def timeout_keep_alive_handler(self) -> None:
        if not self.transport.is_closing():
            self.connections_open.cut["idle_timeout"] += 1
        super().timeout_keep_alive_handler()

    def cut(self, reason: str) -> None:
        """Close a connection that waits for a request (408 if it had begun one)."""
        self.connections_open.cut[reason] += 1
        self._cancel_header_timer()
        if self.transport.is_closing():
            return
        if self._sent_bytes:
            self.transport.write(_plain_response(408, "Request Timeout", _TIMED_OUT))
        self.transport.close()

    def _await_request(self) -> None:
        self.waiting_since = time.monotonic()
        self._sent_bytes = False

    def _arm_header_timer(self) -> None:
        self._cancel_header_timer()
        timeout = self.connections_open.limits.header_timeout
        if timeout > 0:
            self._header_timer = self.loop.call_later(timeout, self.cut, "header_timeout")

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _refuse(self) -> None:
        """Answer 503 and close our side; the client's request is read and dropped until
        it closes too (or REFUSED_LINGER_S pass): closing over unread bytes would reset
        the connection, and the client might never read the answer."""
        self.connections_open.cut["refused"] += 1
        self.waiting_since = None
        self._refused = True
        self.transport.write(_plain_response(503, "Service Unavailable", _TOO_MANY))
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(REFUSED_LINGER_S, self.transport.close)


_TIMED_OUT = "the request's headers did not arrive in time (--header-timeout)"
_TOO_MANY = (
    "too many open connections, all busy with requests (--max-connections,"
    " --max-connections-per-client): retry later"
)


def _plain_response(status: int, reason: str, message: str) -> bytes:
    """A whole HTTP/1.1 response in OpenAI's error shape, written before closing."""
    body = json.dumps(error_body(status, message, code="connection_limit")).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body
