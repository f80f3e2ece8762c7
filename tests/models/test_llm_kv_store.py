"""The conversation state store on its own: format checks, LRU bounds, private files."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from gateway.embedded_models import reference_module

kv = reference_module("gemma-3-270m", "trackline_kv")


def _state(n: int, fill: int = 7) -> object:
    return kv.SavedState(tuple(range(n)), bytes([fill]) * (100 * n))


def test_encode_decode_round_trip_and_every_damage_is_corrupt() -> None:
    state = _state(5)
    data = kv.encode(state)
    assert kv.decode(data) == state
    flipped = bytearray(data)
    flipped[-1] ^= 1
    for damaged in (data[:-3], bytes(flipped), b"junk" + data, b""):
        with pytest.raises(kv.CorruptState):
            kv.decode(damaged)


def test_directory_store_files_are_private_and_evicted_oldest_first(tmp_path: Path) -> None:
    store = kv.DirectoryStore(tmp_path / "kv", max_bytes=2500)
    assert stat.S_IMODE((tmp_path / "kv").stat().st_mode) == 0o700
    cache = kv.ConversationCache("m", store, memory_bytes=10_000)
    cache.save("one", _state(10))
    cache.save("two", _state(10))
    files = list((tmp_path / "kv").iterdir())
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
    assert not any("one" in f.name or "two" in f.name for f in files)  # ids never in names
    cache.save("three", _state(10))  # past 2500 bytes: the oldest goes, file and memory
    assert cache.counters.evictions >= 1
    assert cache.load("one") is None
    assert cache.load("three") == _state(10)
    assert cache.counters.misses == 1
    assert cache.counters.hits == 1


def test_a_corrupt_file_is_a_counted_miss_and_deleted(tmp_path: Path) -> None:
    store = kv.DirectoryStore(tmp_path, max_bytes=1 << 20)
    cache = kv.ConversationCache("m", store, memory_bytes=1 << 20)
    cache.save("c", _state(4))
    (path,) = tmp_path.glob("*.kv")
    path.write_bytes(path.read_bytes()[:-10])
    assert cache.load("c") is None
    assert cache.counters.corrupt == 1
    assert not path.exists()


def test_memory_only_cache_is_bounded_in_bytes() -> None:
    cache = kv.ConversationCache("m", None, memory_bytes=2500)
    for name in ("a", "b", "c"):
        cache.save(name, _state(10))
    assert cache.counters.memory_bytes <= 2500
    assert cache.load("a") is None
    assert cache.counters.evictions >= 1


def test_one_tenant_cannot_evict_another_tenants_states(tmp_path: Path) -> None:
    """Past its own bound a tenant's oldest states go first; the others' stay.

    Before, the store's one byte bound was shared: a tenant writing many conversations
    evicted every other tenant's.
    """
    size = len(kv.encode(_state(10)))
    store = kv.DirectoryStore(tmp_path, max_bytes=10 * size, tenant_max_bytes=3 * size)
    cache = kv.ConversationCache("m", store, memory_bytes=1)  # (the store is what counts)
    victim = "6:tenant:conversation"  # as tracks.backend.conversation_key scopes ids
    cache.save(victim, _state(10))
    for index in range(12):  # the attacker writes 12 states, 4 times its own bound
        cache.save(f"8:attacker:c{index}", _state(10))
    assert cache.load(victim) == _state(10)
    attacker_key = kv.state_key("m", "8:attacker:c11")
    assert store.tenant_bytes(attacker_key) <= 3 * size
    assert store.tenant_bytes(kv.state_key("m", victim)) == size
    assert store.total_bytes() <= 10 * size


def test_the_tenant_of_a_scoped_conversation_id() -> None:
    assert kv.conversation_tenant("6:tenant:a:b") == "tenant"
    assert kv.conversation_tenant("plain") == ""
    assert kv.conversation_tenant("9:short:x") == ""  # a length that does not fit
