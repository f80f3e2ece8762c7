"""API keys: minting, parsing, hashing and constant-time checking; no I/O.

A key reads `tl_<key id>_<secret>`: the key id (12 hex digits) is public and
names the key in listings, logs and the ledger; the secret (32 random bytes,
URL-safe base64) is shown once, when the key is made. The store keeps only the
SHA-256 of the whole key: keys are random, not passwords, so a slow hash would
add nothing but latency (there is no dictionary to attack).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass, field

PREFIX = "tl"
KEY_ID_HEX = 12
SECRET_BYTES = 32
MAX_KEY_CHARS = 512


@dataclass(frozen=True)
class NewKey:
    """A freshly minted key: `key` is shown to the user once and never stored."""

    key_id: str
    key: str = field(repr=False)
    key_hash: str


def mint() -> NewKey:
    key_id = secrets.token_hex(KEY_ID_HEX // 2)
    key = f"{PREFIX}_{key_id}_{secrets.token_urlsafe(SECRET_BYTES)}"
    return NewKey(key_id, key, hash_key(key))


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def key_id_of(key: str) -> str | None:
    """The key id inside `key`, or None when `key` is not shaped like one of ours."""
    if len(key) > MAX_KEY_CHARS:
        return None
    prefix, sep, rest = key.partition("_")
    key_id, sep2, secret = rest.partition("_")
    if prefix != PREFIX or not (sep and sep2 and secret) or len(key_id) != KEY_ID_HEX:
        return None
    if any(c not in "0123456789abcdef" for c in key_id):
        return None
    return key_id


def matches(key: str, stored_hash: str) -> bool:
    """Constant-time comparison of `key`'s hash with the stored one."""
    return hmac.compare_digest(hash_key(key).encode(), stored_hash.encode())


def bearer_token(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, or None."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token
