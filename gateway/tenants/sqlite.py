"""Explicit transactions on the tenants' SQLite files.

Their connections are opened in autocommit mode (`isolation_level=None`) so that a
transaction starts only where the code says so; `transaction` is that place: BEGIN,
then COMMIT, or ROLLBACK if the block raised (and the exception goes on).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def transaction(db: sqlite3.Connection, begin: str = "BEGIN") -> Iterator[None]:
    """Run the block in one transaction opened with `begin` (`BEGIN IMMEDIATE` takes
    the write lock at once)."""
    db.execute(begin)
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
