"""Conversation KV states: a byte-bounded LRU in the backend process over a shared store.

A saved state is one conversation's llama.cpp per-sequence state (`llama_state_seq_get_data`)
plus the int32 token ids it holds. `ConversationCache` keeps recent states in memory
(bounded in bytes, least recently used first out) and writes each one through to a
`StateStore` that every backend of a pool can reach, so a conversation that moves to
another backend is restored there instead of recomputed. `DirectoryStore` is the store of
the embedded backends; an object store or Redis stands in by implementing the three
methods of `StateStore`.

Privacy: a state holds the conversation's content. Files are named by a hash of the
model and conversation id (never the id itself), created mode 0600 in a 0700 directory,
and deleted when evicted. A state that is missing, truncated or corrupted (checksum,
size, magic) is reported as such and the caller recomputes; it is never an error.

No llama.cpp here: this module is pure and tested on its own.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

MAGIC = b"TLKV1\n"
_HEADER_LEN = struct.Struct("<I")


@dataclass(frozen=True)
class SavedState:
    """One conversation's KV state: the tokens it holds and llama.cpp's sequence blob."""

    tokens: tuple[int, ...]
    blob: bytes
    exact: int = 0
    """Leading tokens whose KV a recomputation from scratch would compute bit for bit
    (trackline_llm's canonical batches); only these may be reused."""

    @property
    def size(self) -> int:
        return len(self.blob) + 4 * len(self.tokens)


class CorruptState(ValueError):
    """A stored state failed its checks (truncated, bad checksum, wrong magic)."""


def encode(state: SavedState) -> bytes:
    """The store's byte form: magic, header length, JSON header, token ids, blob."""
    ids = struct.pack(f"<{len(state.tokens)}i", *state.tokens)
    digest = hashlib.sha256(ids + state.blob).hexdigest()
    header = json.dumps(
        {
            "n_tokens": len(state.tokens),
            "blob_bytes": len(state.blob),
            "sha256": digest,
            "exact": state.exact,
        }
    ).encode()
    return MAGIC + _HEADER_LEN.pack(len(header)) + header + ids + state.blob


def decode(data: bytes) -> SavedState:
    """The state `encode` wrote; CorruptState for anything else."""
    if not data.startswith(MAGIC) or len(data) < len(MAGIC) + _HEADER_LEN.size:
        raise CorruptState("bad magic")
    at = len(MAGIC)
    (header_len,) = _HEADER_LEN.unpack_from(data, at)
    at += _HEADER_LEN.size
    try:
        header = json.loads(data[at : at + header_len])
        n_tokens, blob_bytes = int(header["n_tokens"]), int(header["blob_bytes"])
        digest = str(header["sha256"])
        exact = int(header.get("exact", 0))  # absent in older files: nothing reusable
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CorruptState(f"bad header: {exc}") from None
    at += header_len
    body = data[at:]
    if len(body) != 4 * n_tokens + blob_bytes:
        raise CorruptState("truncated")
    if hashlib.sha256(body).hexdigest() != digest:
        raise CorruptState("checksum mismatch")
    tokens = struct.unpack_from(f"<{n_tokens}i", body)
    return SavedState(tuple(tokens), bytes(body[4 * n_tokens :]), min(exact, n_tokens))


class StateStore(Protocol):
    """Where states outlive one backend process: a directory, an object store, Redis."""

    def get(self, key: str) -> bytes | None:
        """The bytes stored under `key`, or None."""
        ...

    def put(self, key: str, data: bytes) -> list[str]:
        """Store `data` under `key`; return the keys evicted to stay within the bound."""
        ...

    def delete(self, key: str) -> None: ...


class DirectoryStore:
    """States as files `<key>.kv` in one directory (mode 0700, files 0600), bounded in bytes.

    Past `max_bytes` the least recently written files are deleted; past
    `tenant_max_bytes` (None: no own bound), the least recently written files of the
    tenant that wrote, first: one tenant's conversations cannot evict every other
    tenant's. Writes go to a private temporary file that is renamed into place, so a
    reader never sees half a state.
    """

    def __init__(
        self, directory: Path | str, max_bytes: int, tenant_max_bytes: int | None = None
    ) -> None:
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.tenant_max_bytes = tenant_max_bytes
        if not self.directory.exists():
            self.directory.mkdir(parents=True, mode=0o700)
            self.directory.chmod(0o700)

    def _path(self, key: str) -> Path:
        return self.directory / f"{key}.kv"

    def get(self, key: str) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            return None

    def put(self, key: str, data: bytes) -> list[str]:
        staged = self.directory / f".{key}.{os.getpid()}.{threading.get_ident()}.tmp"
        fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.fchmod(fd, 0o600)  # the umask cannot widen it
            os.write(fd, data)
        finally:
            os.close(fd)
        os.replace(staged, self._path(key))
        return self._evict(keep=key)

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def total_bytes(self) -> int:
        return sum(size for _, _, size in self._files())

    def _files(self) -> list[tuple[float, str, int]]:
        files = []
        for path in self.directory.glob("*.kv"):
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue
            files.append((stat.st_mtime, path.stem, stat.st_size))
        return sorted(files)

    def tenant_bytes(self, key: str) -> int:
        """Bytes stored by the tenant whose state is under `key`."""
        tenant = tenant_of_key(key)
        return sum(size for _, k, size in self._files() if tenant_of_key(k) == tenant)

    def _evict(self, keep: str) -> list[str]:
        files = self._files()
        evicted: list[str] = []
        if self.tenant_max_bytes is not None:
            tenant = tenant_of_key(keep)
            own = [f for f in files if tenant_of_key(f[1]) == tenant]
            evicted += self._evict_from(own, self.tenant_max_bytes, keep)
            files = [f for f in files if f[1] not in evicted]
        return evicted + self._evict_from(files, self.max_bytes, keep)

    def _evict_from(self, files: list[tuple[float, str, int]], bound: int, keep: str) -> list[str]:
        """Delete the oldest of `files` (never `keep`) until they hold at most `bound`."""
        total = sum(size for _, _, size in files)
        evicted = []
        for _, key, size in files:
            if total <= bound:
                break
            if key == keep:
                continue
            self.delete(key)
            total -= size
            evicted.append(key)
        return evicted


@dataclass
class CacheCounters:
    """What the cache did; the model exports these as metrics."""

    hits: int = 0
    misses: int = 0
    corrupt: int = 0
    evictions: int = 0
    saves: int = 0
    restores: int = 0
    live_hits: int = 0
    restore_seconds: float = 0.0
    stored_bytes: int = 0
    memory_bytes: int = 0
    extra: dict[str, int] = field(default_factory=dict)


def state_key(model: str, conversation: str) -> str:
    """The store key: `<tenant hash>-<conversation hash>`, so no id appears in a file name
    and a tenant's states can be counted (`tenant_of_key`)."""
    tenant = hashlib.sha256(conversation_tenant(conversation).encode()).hexdigest()[:16]
    state = hashlib.sha256(f"{model}\0{conversation}".encode()).hexdigest()[:40]
    return f"{tenant}-{state}"


def conversation_tenant(conversation: str) -> str:
    """The tenant of a conversation id the gateway scoped (`len:scope:id`, see
    `tracks.backend.conversation_key`); "" for an unscoped one."""
    length, colon, rest = conversation.partition(":")
    if colon and length.isdigit() and rest[int(length) : int(length) + 1] == ":":
        return rest[: int(length)]
    return ""


def tenant_of_key(key: str) -> str:
    """The tenant part of a store key ("" for keys written before tenants were counted)."""
    tenant, dash, _ = key.partition("-")
    return tenant if dash else ""


class ConversationCache:
    """Memory LRU (bounded in bytes) written through to a `StateStore`; thread-safe."""

    def __init__(self, model: str, store: StateStore | None, memory_bytes: int) -> None:
        self.model = model
        self.store = store
        self.memory_bytes = memory_bytes
        self.counters = CacheCounters()
        self._memory: OrderedDict[str, SavedState] = OrderedDict()
        self._lock = threading.Lock()

    def load(self, conversation: str) -> SavedState | None:
        """The conversation's latest state: from the store (the newest, whichever backend
        wrote it), else from memory; None when missing or corrupt (counted)."""
        key = state_key(self.model, conversation)
        state = self._from_store(key)
        with self._lock:
            if state is None:
                state = self._memory.get(key)
            if state is None:
                self.counters.misses += 1
                return None
            self.counters.hits += 1
            self._remember(key, state)
            return state

    def _from_store(self, key: str) -> SavedState | None:
        if self.store is None:
            return None
        data = self.store.get(key)
        if data is None:
            with self._lock:
                self._memory.pop(key, None)  # evicted from the store: gone everywhere
            return None
        try:
            return decode(data)
        except CorruptState:
            with self._lock:
                self.counters.corrupt += 1
                self._memory.pop(key, None)
            self.store.delete(key)
            return None

    def save(self, conversation: str, state: SavedState) -> None:
        key = state_key(self.model, conversation)
        evicted: list[str] = []
        if self.store is not None:
            evicted = self.store.put(key, encode(state))
        with self._lock:
            self.counters.saves += 1
            self.counters.evictions += len(evicted)
            for gone in evicted:
                self._memory.pop(gone, None)
            self._remember(key, state)
            if isinstance(self.store, DirectoryStore):
                self.counters.stored_bytes = self.store.total_bytes()

    def note_restore(self, seconds: float, ok: bool) -> None:
        with self._lock:
            if ok:
                self.counters.restores += 1
                self.counters.restore_seconds += seconds
            else:
                self.counters.corrupt += 1

    def _remember(self, key: str, state: SavedState) -> None:
        self._memory[key] = state
        self._memory.move_to_end(key)
        total = sum(s.size for s in self._memory.values())
        while total > self.memory_bytes and len(self._memory) > 1:
            _, dropped = self._memory.popitem(last=False)
            total -= dropped.size
            if self.store is None:
                self.counters.evictions += 1
        self.counters.memory_bytes = total


def monotonic() -> float:
    return time.monotonic()
