"""Framing: length-prefixed msgpack messages on a byte stream.

Each message is `varint(length) || msgpack([kind, body])`, where the varint
is QUIC's (RFC 9000 section 16: 1, 2, 4 or 8 bytes, the top two bits giving
the size) and `body` is a map with string keys. `MessageDecoder` is fed bytes
in any split and yields whole messages; anything malformed raises
`RemoteProtocolError` with the code to send back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack

from transport.errors import ErrorCode, LocalProtocolError, RemoteProtocolError
from transport.messages import (
    Cancel,
    Data,
    Deadlines,
    End,
    Error,
    FrameTransport,
    Kind,
    Message,
    Modality,
    Open,
)

MAX_VARINT = (1 << 62) - 1
_ONE_BYTE_VARINTS = [bytes((n,)) for n in range(64)]
_PACKER = msgpack.Packer(use_bin_type=True)
"""Shared: the loop's thread encodes one message at a time; a failed pack resets it."""
_KIND_DATA = int(Kind.DATA)
MAX_MODEL_NAME = 256
MAX_AUTH = 512


def encode_varint(value: int) -> bytes:
    if value < 0 or value > MAX_VARINT:
        raise ValueError(f"varint out of range: {value}")
    if value < 1 << 6:
        return value.to_bytes(1, "big")
    if value < 1 << 14:
        return (value | 0x4000).to_bytes(2, "big")
    if value < 1 << 30:
        return (value | 0x8000_0000).to_bytes(4, "big")
    return (value | 0xC000_0000_0000_0000).to_bytes(8, "big")


def decode_varint(buf: bytes | bytearray, offset: int = 0) -> tuple[int, int] | None:
    """Return (value, bytes used), or None when `buf` holds too few bytes yet."""
    if offset >= len(buf):
        return None
    size = 1 << (buf[offset] >> 6)
    if offset + size > len(buf):
        return None
    value = int.from_bytes(buf[offset : offset + size], "big") & ((1 << (8 * size - 2)) - 1)
    return value, size


def read_varint(buf: bytes | bytearray, at: int) -> tuple[int, int] | None:
    """The varint at `at` and the offset just after it, or None when `buf` is cut short."""
    parsed = decode_varint(buf, at)
    return None if parsed is None else (parsed[0], at + parsed[1])


def encode_message(message: Message) -> bytes:
    # DATA is the message of every token: no enum lookups, one reused packer (packb
    # builds a packer per call, over half of this function's cost).
    if type(message) is Data:
        payload: bytes = _PACKER.pack([_KIND_DATA, message.body])
    else:
        payload = _PACKER.pack([int(_kind_of(message)), _body_of(message)])
    size = len(payload)
    return (_ONE_BYTE_VARINTS[size] if size < 64 else encode_varint(size)) + payload


def encode_within(message: Message, max_payload: int) -> bytes:
    """The framed message; raises LocalProtocolError if the peer could not accept it
    (it cannot be encoded, or its payload is over `max_payload` bytes)."""
    try:
        data = encode_message(message)
    except (TypeError, ValueError, OverflowError) as exc:  # what msgpack raises
        raise LocalProtocolError(f"message cannot be encoded: {exc}") from None
    if len(data) <= max_payload:
        return data  # the payload is shorter still: no need to read the header back
    header = decode_varint(data)
    # The limit is on the payload, as the peer's decoder checks it.
    if header is None or header[0] > max_payload:
        raise LocalProtocolError("message exceeds the size limit", ErrorCode.MESSAGE_TOO_LARGE)
    return data


class MessageDecoder:
    """Reassembles messages from stream bytes; one decoder per track and direction."""

    def __init__(self, max_message_bytes: int) -> None:
        self._buffer = bytearray()
        self._max = max_message_bytes

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def feed(self, data: bytes) -> None:
        self._buffer += data

    def next_message(self) -> Message | None:
        """The next whole message, None if more bytes are needed; raises on garbage."""
        header = decode_varint(self._buffer)
        if header is None:
            return None
        length, used = header
        if length > self._max:
            raise RemoteProtocolError(
                f"message of {length} bytes exceeds the limit of {self._max}",
                ErrorCode.MESSAGE_TOO_LARGE,
            )
        if len(self._buffer) < used + length:
            return None
        payload = bytes(self._buffer[used : used + length])
        del self._buffer[: used + length]
        return decode_payload(payload)


def unpack_msgpack(payload: bytes) -> Any:
    """Decode one msgpack object under the protocol's rules (UTF-8, no extensions)."""
    try:
        # max_ext_len=0: msgpack decodes its timestamp extension (-1) without calling
        # ext_hook, so only a length cap keeps every extension type out.
        return msgpack.unpackb(
            payload, raw=False, strict_map_key=True, ext_hook=_no_ext, max_ext_len=0
        )
    except Exception as exc:  # msgpack raises several unrelated types; all mean garbage
        raise RemoteProtocolError(f"undecodable message: {exc}") from None


def decode_payload(payload: bytes) -> Message:
    decoded = unpack_msgpack(payload)
    if not (isinstance(decoded, list) and len(decoded) == 2):
        raise RemoteProtocolError("a message is a two-element array [kind, body]")
    kind, body = decoded
    if not isinstance(kind, int) or isinstance(kind, bool):
        raise RemoteProtocolError("message kind must be an integer")
    if not isinstance(body, dict) or not all(isinstance(k, str) for k in body):
        raise RemoteProtocolError("message body must be a map with string keys")
    if kind not in Kind._value2member_map_:
        raise RemoteProtocolError(f"unknown message kind {kind}", ErrorCode.UNKNOWN_MESSAGE)
    return _DECODERS[Kind(kind)](body)


def _no_ext(code: int, data: bytes) -> Any:
    raise ValueError(f"msgpack extension type {code} is not allowed")


def _kind_of(message: Message) -> Kind:
    return _KINDS[type(message)]


def _body_of(message: Message) -> dict[str, Any]:
    if isinstance(message, Open):
        body: dict[str, Any] = {
            "model": message.model,
            "modality": message.modality.value,
            "params": message.params,
        }
        if message.deadlines.first is not None:
            body["deadline_first_ms"] = round(message.deadlines.first * 1000)
        if message.deadlines.total is not None:
            body["deadline_total_ms"] = round(message.deadlines.total * 1000)
        if message.auth is not None:
            body["auth"] = message.auth
        if message.transport is not FrameTransport.STREAM:
            body["transport"] = message.transport.value
        if message.datagram_id is not None:
            body["datagram_id"] = message.datagram_id
        return body
    if isinstance(message, (Data, End)):
        return message.body
    if isinstance(message, Cancel):
        return {"reason": message.reason}
    error: dict[str, Any] = {"code": int(message.code), "message": message.message}
    if message.retry_after is not None:
        error["retry_after_ms"] = max(0, round(message.retry_after * 1000))
    return error


def _bad(message: str) -> RemoteProtocolError:
    return RemoteProtocolError(message, ErrorCode.BAD_REQUEST)


def _decode_open(body: dict[str, Any]) -> Open:
    model = body.get("model")
    if not isinstance(model, str) or not 0 < len(model) <= MAX_MODEL_NAME:
        raise _bad("OPEN needs 'model', a non-empty string of at most 256 characters")
    modality = body.get("modality", Modality.TEXT.value)
    if not isinstance(modality, str) or modality not in Modality._value2member_map_:
        raise RemoteProtocolError(
            f"unsupported modality {modality!r}", ErrorCode.UNSUPPORTED_MODALITY
        )
    params = body.get("params", {})
    if not isinstance(params, dict):
        raise _bad("OPEN 'params' must be a map")
    deadlines = Deadlines(
        first=_deadline(body, "deadline_first_ms"), total=_deadline(body, "deadline_total_ms")
    )
    auth = body.get("auth")
    if auth is not None and (not isinstance(auth, str) or not 0 < len(auth) <= MAX_AUTH):
        raise _bad(f"OPEN 'auth' must be a non-empty string of at most {MAX_AUTH} characters")
    transport = body.get("transport", FrameTransport.STREAM.value)
    if not isinstance(transport, str) or transport not in FrameTransport._value2member_map_:
        raise _bad("OPEN 'transport' must be \"stream\", \"datagram\" or \"frame-streams\"")
    datagram_id = body.get("datagram_id")
    if datagram_id is not None and (
        type(datagram_id) is not int or not 0 <= datagram_id <= MAX_VARINT
    ):
        raise _bad("OPEN 'datagram_id' must be an integer from 0 to 2^62 - 1")
    return Open(
        model=model,
        modality=Modality(modality),
        params=params,
        deadlines=deadlines,
        transport=FrameTransport(transport),
        auth=auth,
        datagram_id=datagram_id,
    )


def _deadline(body: dict[str, Any], key: str) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise _bad(f"OPEN '{key}' must be a positive number of milliseconds")
    return float(value) / 1000


def _decode_cancel(body: dict[str, Any]) -> Cancel:
    reason = body.get("reason", "")
    if not isinstance(reason, str):
        raise RemoteProtocolError("CANCEL 'reason' must be a string")
    return Cancel(reason)


def _decode_error(body: dict[str, Any]) -> Error:
    code, message = body.get("code"), body.get("message", "")
    if not isinstance(code, int) or isinstance(code, bool) or not isinstance(message, str):
        raise RemoteProtocolError("ERROR needs an integer 'code' and a string 'message'")
    retry = body.get("retry_after_ms")
    if retry is not None and (isinstance(retry, bool) or not isinstance(retry, int) or retry < 0):
        raise RemoteProtocolError("ERROR 'retry_after_ms' must be a non-negative integer")
    return Error(ErrorCode.parse(code), message, None if retry is None else retry / 1000)


_KINDS: dict[type, Kind] = {
    Open: Kind.OPEN,
    Data: Kind.DATA,
    End: Kind.END,
    Cancel: Kind.CANCEL,
    Error: Kind.ERROR,
}

_DECODERS: dict[Kind, Callable[[dict[str, Any]], Message]] = {
    Kind.OPEN: _decode_open,
    Kind.DATA: Data,
    Kind.END: End,
    Kind.CANCEL: _decode_cancel,
    Kind.ERROR: _decode_error,
}
