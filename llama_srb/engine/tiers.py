"""The prefix cache's lower tiers: KV state bytes of token paths in host memory and on disk.

A path the live cells no longer keep is copied down here (llama.cpp's per-sequence state,
`Context.state_get`) rather than dropped, and a later prompt that starts with it gets its
cells back (`Context.state_set`) instead of reading it again. Host memory holds entries
under an LRU byte budget; what falls out of it goes to disk under another; at shutdown the
rest follows, so a story outlives the process.

Disk files are never trusted: each names what made its bytes meaningful (the fingerprint:
model file, llama.cpp build, KV types, sliding window) and carries a checksum; every size
in it is checked against the file's before anything is read, and a file that is foreign,
stale, truncated, corrupt or otherwise damaged is removed with a log line and its prompt
read again instead. Writes go to a locked temporary name in the same folder, are fsynced
and renamed, so another process sharing the folder (or this one after a kill -9) never
sees half a file; a dead writer's temporary file goes at the next start. A disk that
fails a write (full, read-only) turns the disk tier off; serving goes on.

Sliding-window layers: llama.cpp saves only the cells the sequence's last position still
sees, so a restored entry is exact for a prompt that extends all of it (or all but its last
token, decoded again for its logits), never for a fork from inside it: its `floor`.

Single-threaded: only the engine thread uses a store.
"""

from __future__ import annotations

import enum
import fcntl
import hashlib
import itertools
import json
import logging
import os
import struct
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, TypeGuard

import numpy as np
import numpy.typing as npt

log = logging.getLogger(__name__)

Tokens = npt.NDArray[np.int32]

MAGIC = b"SRBKV\x00\x01\n"  # file type and format version
SUFFIX = ".kv"
_LENGTH = struct.Struct("<I")  # the header's byte length, after the magic
MAX_HEADER_BYTES = 1 << 16
MAX_HEADER_BRACKETS = 8  # the header is one flat object: this bounds json's recursion
MiB = 1 << 20
# What reading and parsing a file's bytes can raise: each means "drop this file".
UNREADABLE = (OSError, ValueError, LookupError, TypeError, RecursionError, struct.error)


class Tier(enum.Enum):
    HOST = "host"
    DISK = "disk"


@dataclass(eq=False)
class TierEntry:
    """A saved path: its tokens and where its state bytes are."""

    tokens: Tokens
    nbytes: int
    floor: int  # a prompt must share at least this many tokens for the restore to be exact
    tier: Tier
    last_used: int
    data: bytes | None = None  # host tier
    path: Path | None = None  # disk tier

    def __len__(self) -> int:
        return len(self.tokens)


def common_prefix(a: Tokens, b: Tokens) -> int:
    m = min(len(a), len(b))
    mismatches = np.flatnonzero(a[:m] != b[:m])
    return int(mismatches[0]) if mismatches.size else m


def checksum(tokens: Tokens, data: bytes) -> str:
    digest = hashlib.blake2b(tokens.tobytes(), digest_size=32)
    digest.update(data)
    return digest.hexdigest()


class DiskTier:
    """State files under one folder, named by their tokens, each checked against
    `fingerprint` (a dict of strings/ints: what makes the bytes meaningful)."""

    def __init__(self, folder: Path, fingerprint: dict[str, object], budget: int) -> None:
        self.folder = folder
        self.fingerprint = fingerprint
        self.budget = budget
        self.enabled = budget > 0
        if self.enabled:
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                self.disable(f"cannot create {folder}: {exc}")

    def disable(self, why: str) -> None:
        if self.enabled:
            log.warning("disk cache tier off: %s (serving goes on without it)", why)
        self.enabled = False

    def name_for(self, tokens: Tokens) -> Path:
        return self.folder / (
            hashlib.blake2b(tokens.tobytes(), digest_size=16).hexdigest() + SUFFIX
        )

    def write(self, tokens: Tokens, data: bytes) -> Path | None:
        """Write one entry atomically; None (and the tier off) when the disk refuses."""
        if not self.enabled:
            return None
        header = json.dumps(
            {
                **self.fingerprint,
                "n_tokens": len(tokens),
                "payload_bytes": len(data),
                "checksum": checksum(tokens, data),
            }
        ).encode()
        target = self.name_for(tokens)
        tmp: str | None = None
        try:
            fd, tmp = tempfile.mkstemp(prefix=".", suffix=".tmp", dir=self.folder)
            with os.fdopen(fd, "wb") as f:
                # Held until renamed: a start that finds the lock free knows the writer died.
                fcntl.flock(f, fcntl.LOCK_EX)
                f.write(MAGIC + _LENGTH.pack(len(header)) + header)
                f.write(tokens.astype("<i4").tobytes())
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
                os.replace(tmp, target)
            return target
        except OSError as exc:
            if tmp is not None:
                with _quiet():
                    os.unlink(tmp)
            self.disable(f"writing {target.name} failed: {exc}")
            return None

    def read_header(self, f: BinaryIO) -> tuple[dict[str, object], Tokens, int]:
        """An open file's header, its tokens and its payload's size, the file left at the
        payload. Every size is checked against the file's before it is read; raises
        ValueError when the file is not one of ours, is for other cells, or is damaged."""
        size = os.fstat(f.fileno()).st_size
        if f.read(len(MAGIC)) != MAGIC:
            raise ValueError("not a llama-srb KV file (or another format version)")
        (length,) = _LENGTH.unpack(_read(f, _LENGTH.size))
        if not 0 < length <= min(MAX_HEADER_BYTES, size - f.tell()):
            raise ValueError(f"bad header length {length}")
        header = parse_header(_read(f, length))
        mismatched = [k for k, v in self.fingerprint.items() if header.get(k) != v]
        if mismatched:
            raise ValueError(f"made for other cells ({', '.join(mismatched)} differ)")
        n_tokens, payload = header.get("n_tokens"), header.get("payload_bytes")
        if not _is_count(n_tokens) or not _is_count(payload) or n_tokens == 0:
            raise ValueError("bad header (n_tokens, payload_bytes)")
        if max(4 * n_tokens, payload) > self.budget:  # never kept: not read either
            raise ValueError("larger than the disk tier's budget")
        if f.tell() + 4 * n_tokens + payload != size:
            raise ValueError("truncated (its size is not the one its header gives)")
        tokens = np.frombuffer(_read(f, 4 * n_tokens), dtype="<i4").astype(np.int32)
        return header, tokens, payload

    def read(self, path: Path, tokens: Tokens, nbytes: int) -> bytes | None:
        """An entry's payload, checked; None (and the file removed) if it is not intact or
        is not the entry indexed (`tokens`, `nbytes`) any more."""
        with self._dropping_damaged(path), path.open("rb") as f:
            header, held, payload = self.read_header(f)
            if payload != nbytes or not np.array_equal(held, tokens):
                raise ValueError("changed since it was indexed")
            data = _read(f, payload)
            if checksum(held, data) != header.get("checksum"):
                raise ValueError("checksum mismatch (corrupt)")
            return data
        return None

    def index(self) -> list[tuple[Path, Tokens, int, float]]:
        """Every valid file: (path, tokens, payload bytes, mtime), oldest first. Invalid ones
        are removed with a log line, and so are temporary files of a writer that died."""
        if not self.enabled:
            return []
        self._sweep_temporaries()
        found = []
        for path in sorted(self.folder.glob("*" + SUFFIX)):
            with self._dropping_damaged(path), path.open("rb") as f:
                _, tokens, payload = self.read_header(f)
                found.append((path, tokens, payload, os.fstat(f.fileno()).st_mtime))
        found.sort(key=lambda item: item[3])
        return found

    def _sweep_temporaries(self) -> None:
        """Remove the temporary files of writers that died (a kill -9 mid-write): a live
        writer, in this folder's other processes, holds its file's lock."""
        for tmp in self.folder.glob(".*.tmp"):
            with _quiet(), tmp.open("rb") as f:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue
                log.warning("disk cache: removing %s, left by a writer that died", tmp.name)
                tmp.unlink()

    def _dropping_damaged(self, path: Path) -> _DropDamaged:
        return _DropDamaged(self, path)

    def remove(self, path: Path) -> None:
        with _quiet():
            path.unlink(missing_ok=True)

    def touch(self, path: Path) -> None:
        with _quiet():
            os.utime(path)  # the LRU order survives a restart


class _quiet:
    """Ignore OSError: removing a file another process removed first is fine."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: object, tb: object) -> bool:
        return isinstance(exc, OSError)


def parse_header(raw: bytes) -> dict[str, object]:
    """A header as `DiskTier.write` makes it: one flat JSON object of scalars. The brackets
    are counted first, so that no header, however nested, recurses deep in json."""
    if raw.count(b"[") + raw.count(b"{") > MAX_HEADER_BRACKETS:
        raise ValueError("bad header (nested)")
    try:
        header = json.loads(raw)
    except ValueError as exc:  # UnicodeDecodeError too
        raise ValueError(f"bad header ({exc})") from None
    scalars = (str, int, float, bool, type(None))
    if not isinstance(header, dict) or not all(isinstance(v, scalars) for v in header.values()):
        raise ValueError("bad header (not a flat object)")
    return header


def _read(f: BinaryIO, n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise ValueError("truncated")
    return data


def _is_count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class _DropDamaged:
    """Whatever reading or parsing a file raises (its bytes are never trusted) drops it:
    a log line, the file removed, and the block's exception swallowed."""

    def __init__(self, disk: DiskTier, path: Path) -> None:
        self.disk, self.path = disk, path

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: object, tb: object) -> bool:
        if not isinstance(exc, UNREADABLE):
            return False
        log.warning("disk cache: removing %s: %s", self.path.name, exc)
        self.disk.remove(self.path)
        return True


@dataclass
class TierCounters:
    """What the tiers hold (gauges) and moved (counters), per tier."""

    entries: dict[Tier, int] = field(default_factory=lambda: dict.fromkeys(Tier, 0))
    bytes_held: dict[Tier, int] = field(default_factory=lambda: dict.fromkeys(Tier, 0))
    saves: int = 0
    bytes_saved: int = 0
    dropped: int = 0  # entries that fell out of the last tier's budget

    def copy(self) -> TierCounters:
        return TierCounters(
            dict(self.entries), dict(self.bytes_held), self.saves, self.bytes_saved, self.dropped
        )


class TierStore:
    """Host memory and disk tiers under one index (the engine thread's only)."""

    def __init__(
        self, host_budget: int, disk: DiskTier | None = None, sliding_window: bool = False
    ):
        self.host_budget = host_budget
        self.disk = disk
        self.sliding_window = sliding_window
        self.entries: list[TierEntry] = []
        self.generation = 0  # changes whenever the set of entries does
        self.counters = TierCounters()
        self._clock = itertools.count()
        if disk is not None:
            for path, tokens, nbytes, _ in disk.index():  # oldest first: the LRU order
                floor, used = self.floor_for(len(tokens)), next(self._clock)
                self._add(TierEntry(tokens, nbytes, floor, Tier.DISK, used, path=path))
            self._fit()
            if self.entries:
                log.info(
                    "disk cache: %d saved paths (%.1f MiB) in %s",
                    len(self.entries),
                    self.counters.bytes_held[Tier.DISK] / MiB,
                    disk.folder,
                )

    @property
    def enabled(self) -> bool:
        return self.host_budget > 0 or (self.disk is not None and self.disk.enabled)

    def floor_for(self, n_tokens: int) -> int:
        return n_tokens - 1 if self.sliding_window else 0

    def best(self, tokens: Tokens, limit: int, max_len: int) -> tuple[TierEntry | None, int]:
        """The entry a prompt can restore the most of (at most `limit` tokens, from an entry
        of at most `max_len`), and how many."""
        best, best_n = None, 0
        for entry in self.entries:
            n = min(common_prefix(tokens, entry.tokens), limit)
            if n > best_n and n >= entry.floor and len(entry) <= max_len:
                best, best_n = entry, n
        return best, best_n

    def put(self, tokens: Tokens, data: bytes) -> None:
        """Keep a path's state (in host memory, else on disk): it replaces the entries it
        makes redundant, and is not kept if one already serves every prompt it would."""
        floor = self.floor_for(len(tokens))
        for entry in self.entries:
            shared = common_prefix(tokens, entry.tokens)
            if shared == len(tokens) and entry.floor <= floor:
                self.touch(entry)
                return
        for entry in [e for e in self.entries if self._covers(tokens, floor, e)]:
            self._drop(entry)
        self.counters.saves += 1
        self.counters.bytes_saved += len(data)
        entry = TierEntry(tokens, len(data), floor, Tier.HOST, next(self._clock), data=data)
        if len(data) > self.host_budget and not self._demote(entry):
            return
        self._add(entry)
        self._fit()

    def load(self, entry: TierEntry) -> bytes | None:
        """An entry's bytes (None: gone or corrupt, and dropped)."""
        self.touch(entry)
        if entry.data is not None:
            return entry.data
        data = None
        if entry.path is not None and self.disk is not None:
            data = self.disk.read(entry.path, entry.tokens, entry.nbytes)
        if data is None:
            self._drop(entry, remove_file=False)  # read() removed a bad file already
        return data

    def drop(self, entry: TierEntry) -> None:
        """Forget an entry whose bytes llama.cpp refused."""
        self._drop(entry)

    def touch(self, entry: TierEntry) -> None:
        entry.last_used = next(self._clock)
        if entry.path is not None and self.disk is not None:
            self.disk.touch(entry.path)

    def flush(self) -> None:
        """Write every host entry to disk (at shutdown: so that they survive it)."""
        for entry in sorted(self._in(Tier.HOST), key=lambda e: e.last_used):
            self._remove_from_index(entry)
            if self._demote(entry):
                self._add(entry)
        self._fit()

    # -- budgets -----------------------------------------------------------------------

    def _covers(self, tokens: Tokens, floor: int, entry: TierEntry) -> bool:
        """Whether a new entry serves every prompt `entry` does."""
        return common_prefix(tokens, entry.tokens) == len(entry) and floor <= entry.floor

    def _in(self, tier: Tier) -> list[TierEntry]:
        return [e for e in self.entries if e.tier is tier]

    def _fit(self) -> None:
        """Host memory over budget: its least recently used entries go to disk; disk over
        budget: its least recently used files go."""
        host = sorted(self._in(Tier.HOST), key=lambda e: e.last_used)
        while host and self.counters.bytes_held[Tier.HOST] > self.host_budget:
            entry = host.pop(0)
            self._remove_from_index(entry)
            if self._demote(entry):
                self._add(entry)
        if self.disk is None:
            return
        disk = sorted(self._in(Tier.DISK), key=lambda e: e.last_used)
        while disk and self.counters.bytes_held[Tier.DISK] > self.disk.budget:
            self._drop(disk.pop(0))

    def _demote(self, entry: TierEntry) -> bool:
        """Move a host entry's bytes to disk (False: it is dropped: no disk tier)."""
        assert entry.data is not None
        too_big = self.disk is None or entry.nbytes > self.disk.budget
        path = None if too_big or self.disk is None else self.disk.write(entry.tokens, entry.data)
        if path is None:
            self.counters.dropped += 1
            return False
        entry.tier, entry.path, entry.data = Tier.DISK, path, None
        return True

    def _add(self, entry: TierEntry) -> None:
        self.entries.append(entry)
        self.counters.entries[entry.tier] += 1
        self.counters.bytes_held[entry.tier] += entry.nbytes
        self.generation += 1

    def _remove_from_index(self, entry: TierEntry) -> None:
        self.entries.remove(entry)
        self.counters.entries[entry.tier] -= 1
        self.counters.bytes_held[entry.tier] -= entry.nbytes
        self.generation += 1

    def _drop(self, entry: TierEntry, remove_file: bool = True) -> None:
        self._remove_from_index(entry)
        if remove_file and entry.path is not None and self.disk is not None:
            self.disk.remove(entry.path)


def file_sha256(path: Path, stamps: Path) -> str:
    """A file's sha256, computed once: a stamp under `stamps`, keyed by the file's path,
    size and modification time, keeps it for later starts."""
    stat = path.stat()
    key = f"{path.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}"
    stamp = stamps / hashlib.blake2b(key.encode(), digest_size=16).hexdigest()
    try:
        cached = stamp.read_text().strip()
        if len(cached) == 64:
            return cached
    except OSError:
        pass
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    with _quiet():
        stamps.mkdir(parents=True, exist_ok=True)
        stamp.write_text(digest.hexdigest() + "\n")
    return digest.hexdigest()
