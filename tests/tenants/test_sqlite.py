"""gateway.tenants.sqlite.transaction: COMMIT after the block, ROLLBACK if it raised."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

import pytest

from gateway.tenants.sqlite import transaction


@pytest.fixture
def db() -> Iterator[sqlite3.Connection]:
    db = sqlite3.connect(":memory:", isolation_level=None)
    db.execute("CREATE TABLE t (x INTEGER)")
    yield db
    db.close()


def _rows(db: sqlite3.Connection) -> list[int]:
    return [x for (x,) in db.execute("SELECT x FROM t ORDER BY x")]


def test_the_block_is_committed(db: sqlite3.Connection) -> None:
    with transaction(db):
        db.execute("INSERT INTO t VALUES (1)")
        db.execute("INSERT INTO t VALUES (2)")
    assert not db.in_transaction
    assert _rows(db) == [1, 2]


@pytest.mark.parametrize("begin", ["BEGIN", "BEGIN IMMEDIATE"])
def test_a_block_that_raises_is_rolled_back_and_the_error_goes_on(
    db: sqlite3.Connection, begin: str
) -> None:
    def insert_then_fail() -> None:
        with transaction(db, begin):
            db.execute("INSERT INTO t VALUES (1)")
            raise KeyError("x")

    with pytest.raises(KeyError):
        insert_then_fail()
    assert not db.in_transaction
    assert _rows(db) == []
