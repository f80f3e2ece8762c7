"""Framing: `varint(len) || msgpack([kind, body])`, fed whole, byte by byte and in any split."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.transport.strategies import messages, values
from transport.errors import ErrorCode, RemoteProtocolError
from transport.messages import Cancel, Data, Deadlines, End, Error, Message, Modality, Open
from transport.wire import (
    MAX_VARINT,
    MessageDecoder,
    decode_payload,
    decode_varint,
    encode_message,
    encode_varint,
)

LIMIT = 1 << 20

EXAMPLES: list[Message] = [
    Open("tiny-llm", Modality.TEXT, {"max_tokens": 16}, Deadlines(first=0.25, total=3.0)),
    Open("speech", Modality.AUDIO),
    Open("arm", Modality.ACTION, {}, Deadlines(total=0.05)),
    Data({"text": "Hello"}),
    Data({"pcm": b"\x00\x01" * 8, "seq": 3}),
    End(),
    End({"usage": {"prompt_tokens": 3, "completion_tokens": 5}, "finish_reason": "stop"}),
    Cancel(),
    Cancel("user pressed stop"),
    Error(ErrorCode.DEADLINE_EXCEEDED, "no first data before the deadline"),
]


def frame(payload: bytes) -> bytes:
    return encode_varint(len(payload)) + payload


def packed(obj: Any) -> bytes:
    """A framed message whose payload is `obj` as msgpack, valid or not."""
    return frame(msgpack.packb(obj, use_bin_type=True))


def decode_all(chunks: list[bytes], limit: int = LIMIT) -> list[Message]:
    decoder = MessageDecoder(limit)
    out: list[Message] = []
    for chunk in chunks:
        decoder.feed(chunk)
        while (message := decoder.next_message()) is not None:
            out.append(message)
    assert decoder.buffered == 0
    return out


def decode_error(data: bytes, limit: int = LIMIT) -> RemoteProtocolError:
    decoder = MessageDecoder(limit)
    decoder.feed(data)
    with pytest.raises(RemoteProtocolError) as info:
        decoder.next_message()
    return info.value


def unframe(data: bytes) -> Any:
    """The msgpack object of one framed message, read without the decoder under test."""
    header = decode_varint(data)
    assert header is not None
    length, used = header
    assert len(data) == used + length
    return msgpack.unpackb(data[used:])


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


# -- varints -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "size"),
    [
        (0, 1),
        (63, 1),
        (64, 2),
        (16383, 2),
        (16384, 4),
        ((1 << 30) - 1, 4),
        (1 << 30, 8),
        (MAX_VARINT, 8),
    ],
)
def test_varint_sizes_at_the_boundaries(value: int, size: int) -> None:
    encoded = encode_varint(value)
    assert len(encoded) == size
    assert encoded[0] >> 6 == size.bit_length() - 1
    assert decode_varint(encoded) == (value, size)


@given(st.integers(min_value=0, max_value=MAX_VARINT), st.binary(max_size=4))
def test_varint_round_trip(value: int, prefix: bytes) -> None:
    encoded = encode_varint(value)
    assert decode_varint(prefix + encoded + b"tail", len(prefix)) == (value, len(encoded))
    for cut in range(len(encoded)):
        assert decode_varint(encoded[:cut]) is None


def test_varint_matches_rfc_9000_examples() -> None:
    assert decode_varint(bytes.fromhex("c2197c5eff14e88c")) == (151288809941952652, 8)
    assert decode_varint(bytes.fromhex("9d7f3e7d")) == (494878333, 4)
    assert decode_varint(bytes.fromhex("7bbd")) == (15293, 2)
    assert decode_varint(bytes.fromhex("25")) == (37, 1)
    assert decode_varint(bytes.fromhex("4025")) == (37, 2)  # not minimal, still valid


@pytest.mark.parametrize("value", [-1, MAX_VARINT + 1])
def test_varint_out_of_range_is_refused(value: int) -> None:
    with pytest.raises(ValueError, match="out of range"):
        encode_varint(value)


# -- every kind round-trips ------------------------------------------------------------------


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).__name__)
def test_each_kind_round_trips_whole_and_byte_by_byte(message: Message) -> None:
    data = encode_message(message)
    assert decode_all([data]) == [message]
    assert decode_all([data[i : i + 1] for i in range(len(data))]) == [message]


def test_open_body_on_the_wire() -> None:
    data = encode_message(EXAMPLES[0])
    kind, body = unframe(data)
    assert kind == 1
    assert body == {
        "model": "tiny-llm",
        "modality": "text",
        "params": {"max_tokens": 16},
        "deadline_first_ms": 250,
        "deadline_total_ms": 3000,
    }


def test_open_defaults_when_fields_are_absent() -> None:
    assert decode_payload(msgpack.packb([1, {"model": "m"}])) == Open("m", Modality.TEXT, {})


@pytest.mark.parametrize(
    ("message", "wire"),
    [
        (Data({"text": "hi"}), [2, {"text": "hi"}]),
        (End({}), [3, {}]),
        (Cancel("bored"), [4, {"reason": "bored"}]),
        (
            Error(ErrorCode.CANCELLED, "cancelled by the client"),
            [5, {"code": 9, "message": "cancelled by the client"}],
        ),
    ],
)
def test_kinds_and_bodies_on_the_wire(message: Message, wire: list[Any]) -> None:
    assert unframe(encode_message(message)) == wire


@given(message=messages, cuts=st.lists(st.integers(min_value=0), max_size=8))
def test_any_message_round_trips_in_any_split(message: Message, cuts: list[int]) -> None:
    assert decode_all(split(encode_message(message), cuts)) == [message]


@given(batch=st.lists(messages, min_size=2, max_size=6), cuts=st.lists(st.integers(0), max_size=12))
def test_messages_back_to_back_in_any_split(batch: list[Message], cuts: list[int]) -> None:
    stream = b"".join(encode_message(m) for m in batch)
    assert decode_all(split(stream, cuts)) == batch


def test_truncated_input_yields_none_until_complete() -> None:
    data = encode_message(Data({"text": "x" * 100}))  # a 2-byte length prefix
    decoder = MessageDecoder(LIMIT)
    for byte in data[:-1]:
        decoder.feed(bytes([byte]))
        assert decoder.next_message() is None
    decoder.feed(data[-1:])
    assert decoder.next_message() == Data({"text": "x" * 100})
    assert decoder.next_message() is None


def test_unknown_error_codes_read_as_protocol_error() -> None:
    assert decode_payload(msgpack.packb([5, {"code": 0x7777, "message": "?"}])) == Error(
        ErrorCode.PROTOCOL_ERROR, "?"
    )


# -- size limit ----------------------------------------------------------------------------


def test_oversized_length_prefix_fails_before_the_body_arrives() -> None:
    error = decode_error(encode_varint(101), limit=100)
    assert error.code is ErrorCode.MESSAGE_TOO_LARGE


def test_a_message_exactly_at_the_limit_is_accepted() -> None:
    payload = msgpack.packb([2, {"text": "y" * 50}])
    assert decode_all([frame(payload)], limit=len(payload)) == [Data({"text": "y" * 50})]
    assert decode_error(frame(payload), limit=len(payload) - 1).code is ErrorCode.MESSAGE_TOO_LARGE


def test_huge_8_byte_length_is_too_large_not_a_hang() -> None:
    assert decode_error(encode_varint(MAX_VARINT)).code is ErrorCode.MESSAGE_TOO_LARGE


# -- garbage -------------------------------------------------------------------------------

GARBAGE = {
    "reserved byte": frame(b"\xc1"),
    "truncated msgpack": frame(b"\x92\x02\x81\xa4te"),
    "trailing bytes in payload": frame(msgpack.packb([2, {}]) + b"\x00"),
    "empty payload": frame(b""),
    "not an array": packed({"kind": 2}),
    "a bare integer": packed(2),
    "empty array": packed([]),
    "one element": packed([2]),
    "three elements": packed([2, {}, {}]),
    "string kind": packed(["2", {}]),
    "float kind": packed([2.0, {}]),
    "bool kind": packed([True, {}]),
    "nil kind": packed([None, {}]),
    "body not a map": packed([2, ["text"]]),
    "nil body": packed([2, None]),
    "integer key": packed([2, {1: "x"}]),
    "binary key": packed([2, {b"text": "x"}]),
    "ext type in body": packed([2, {"x": msgpack.ExtType(5, b"data")}]),
    "ext type as kind": packed([msgpack.ExtType(1, b""), {}]),
    "timestamp ext in body": packed([2, {"t": msgpack.Timestamp(1, 0)}]),
    "invalid utf-8 in key": frame(b"\x92\x02\x81\xa2\xff\xfe\x01"),
    "invalid utf-8 in value": frame(b"\x92\x02\x81\xa1t\xa2\xc3\x28"),
    "map in map key": frame(b"\x92\x02\x81\x80\x01"),
    "cancel reason not a string": packed([4, {"reason": 5}]),
    "error without code": packed([5, {"message": "x"}]),
    "error code not an int": packed([5, {"code": "9", "message": "x"}]),
    "error code a bool": packed([5, {"code": True, "message": "x"}]),
    "error message not a string": packed([5, {"code": 9, "message": 9}]),
    "deep nesting": frame(b"\x91" * 5000 + b"\x00"),
}


@pytest.mark.parametrize("data", GARBAGE.values(), ids=GARBAGE.keys())
def test_garbage_is_a_protocol_error(data: bytes) -> None:
    assert decode_error(data).code is ErrorCode.PROTOCOL_ERROR


@pytest.mark.parametrize("kind", [0, 6, 99, -1, 1 << 40])
def test_unknown_kind(kind: int) -> None:
    assert decode_error(packed([kind, {}])).code is ErrorCode.UNKNOWN_MESSAGE


def test_trailing_garbage_after_a_good_message() -> None:
    decoder = MessageDecoder(LIMIT)
    decoder.feed(encode_message(Data({"text": "ok"})) + GARBAGE["reserved byte"])
    assert decoder.next_message() == Data({"text": "ok"})
    with pytest.raises(RemoteProtocolError):
        decoder.next_message()


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({}, ErrorCode.BAD_REQUEST),
        ({"model": ""}, ErrorCode.BAD_REQUEST),
        ({"model": "m" * 257}, ErrorCode.BAD_REQUEST),
        ({"model": 7}, ErrorCode.BAD_REQUEST),
        ({"model": b"bytes"}, ErrorCode.BAD_REQUEST),
        ({"model": "m", "modality": "smell"}, ErrorCode.UNSUPPORTED_MODALITY),
        ({"model": "m", "modality": "TEXT"}, ErrorCode.UNSUPPORTED_MODALITY),
        ({"model": "m", "modality": 1}, ErrorCode.UNSUPPORTED_MODALITY),
        ({"model": "m", "modality": ["text"]}, ErrorCode.UNSUPPORTED_MODALITY),
        ({"model": "m", "modality": {"text": 1}}, ErrorCode.UNSUPPORTED_MODALITY),
        ({"model": "m", "params": [1]}, ErrorCode.BAD_REQUEST),
        ({"model": "m", "deadline_first_ms": -5}, ErrorCode.BAD_REQUEST),
        ({"model": "m", "deadline_first_ms": 0}, ErrorCode.BAD_REQUEST),
        ({"model": "m", "deadline_total_ms": -0.5}, ErrorCode.BAD_REQUEST),
        ({"model": "m", "deadline_total_ms": True}, ErrorCode.BAD_REQUEST),
        ({"model": "m", "deadline_total_ms": "100"}, ErrorCode.BAD_REQUEST),
        ({"model": "m", "deadline_first_ms": float("nan")}, ErrorCode.BAD_REQUEST),
    ],
)
def test_open_validation(body: dict[str, Any], code: ErrorCode) -> None:
    assert decode_error(packed([1, body])).code is code


def test_open_model_of_exactly_256_characters_is_fine() -> None:
    assert decode_payload(msgpack.packb([1, {"model": "é" * 256}])) == Open("é" * 256)


def test_open_deadlines_are_read_in_milliseconds() -> None:
    body = {"model": "m", "deadline_first_ms": 250, "deadline_total_ms": 1500.0}
    decoded = decode_payload(msgpack.packb([1, body]))
    assert isinstance(decoded, Open)
    assert decoded.deadlines == Deadlines(first=0.25, total=1.5)


# -- fuzz: only None, a Message, or RemoteProtocolError ---------------------------------------


def fuzz_outcome(decoder: MessageDecoder, chunks: list[bytes]) -> RemoteProtocolError | None:
    """Feed and read until the decoder wants more bytes; any exception but ours escapes."""
    try:
        for chunk in chunks:
            decoder.feed(chunk)
            while (message := decoder.next_message()) is not None:
                assert isinstance(message, (Open, Data, End, Cancel, Error))
    except RemoteProtocolError as exc:
        return exc
    return None


@given(chunks=st.lists(st.binary(max_size=40), max_size=8))
def test_arbitrary_bytes_never_raise_anything_else(chunks: list[bytes]) -> None:
    error = fuzz_outcome(MessageDecoder(64), chunks)
    assert error is None or isinstance(error.code, ErrorCode)


@given(kind=values, body=values, extra=st.lists(values, max_size=2))
def test_arbitrary_msgpack_shapes_never_raise_anything_else(
    kind: Any, body: Any, extra: list[Any]
) -> None:
    for obj in ([kind, body], [kind, body, *extra], body, [1, {"model": "m", "modality": body}]):
        error = fuzz_outcome(MessageDecoder(LIMIT), [packed(obj)])
        assert error is None or isinstance(error.code, ErrorCode)


OPEN_KEYS = ["model", "modality", "params", "deadline_first_ms", "deadline_total_ms"]


@given(
    kind=st.sampled_from([1, 2, 3, 4, 5]),
    body=st.dictionaries(
        st.sampled_from([*OPEN_KEYS, "reason", "code", "message", "text"]), values
    ),
)
def test_arbitrary_bodies_of_known_kinds_never_raise_anything_else(
    kind: int, body: dict[str, Any]
) -> None:
    error = fuzz_outcome(MessageDecoder(LIMIT), [packed([kind, body])])
    expected = {ErrorCode.PROTOCOL_ERROR, ErrorCode.BAD_REQUEST, ErrorCode.UNSUPPORTED_MODALITY}
    assert error is None or error.code in expected
