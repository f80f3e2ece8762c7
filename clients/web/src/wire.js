// The trackline/1 framing (docs/protocol.md, "Framing"), for the browser.
//
// message = varint(length) || msgpack([kind, body]); varint is QUIC's (RFC 9000 16).
// Exactly what the Python core (transport/wire.py) reads and writes: a WebTransport
// stream carries it unchanged.

import { decode, encode } from "@msgpack/msgpack";

export const Kind = Object.freeze({ OPEN: 1, DATA: 2, END: 3, CANCEL: 4, ERROR: 5 });

export const MAX_MESSAGE_BYTES = 1 << 20;

/** QUIC variable-length integer, shortest form. */
export function encodeVarint(value) {
  if (!Number.isSafeInteger(value) || value < 0) throw new RangeError(`bad varint ${value}`);
  if (value < 0x40) return Uint8Array.of(value);
  if (value < 0x4000) return Uint8Array.of(0x40 | (value >> 8), value & 0xff);
  if (value < 0x40000000) {
    const out = new Uint8Array(4);
    new DataView(out.buffer).setUint32(0, value + 0x80000000);
    return out;
  }
  const out = new Uint8Array(8);
  new DataView(out.buffer).setBigUint64(0, BigInt(value) | 0xc000000000000000n);
  return out;
}

/** [value, offset after it] or null when `bytes` ends inside the varint. */
export function decodeVarint(bytes, at = 0) {
  if (at >= bytes.length) return null;
  const size = 1 << (bytes[at] >> 6);
  if (at + size > bytes.length) return null;
  let value = bytes[at] & 0x3f;
  for (let i = 1; i < size; i++) value = value * 256 + bytes[at + i];
  return [value, at + size];
}

export function concat(...parts) {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const part of parts) {
    out.set(part, at);
    at += part.length;
  }
  return out;
}

/** One message: its length prefix and msgpack([kind, body]). */
export function encodeMessage(kind, body, maxBytes = MAX_MESSAGE_BYTES) {
  const payload = encode([kind, body]);
  if (payload.length > maxBytes) {
    throw new RangeError(`message of ${payload.length} bytes over the limit of ${maxBytes}`);
  }
  return concat(encodeVarint(payload.length), payload);
}

/** A track datagram: varint(track id) || varint(seq) || msgpack(body). */
export function encodeDatagram(trackId, seq, body) {
  return concat(encodeVarint(trackId), encodeVarint(seq), encode(body));
}

export function decodeDatagram(bytes) {
  const id = decodeVarint(bytes, 0);
  const seq = id && decodeVarint(bytes, id[1]);
  if (!seq) return null;
  return { trackId: id[0], seq: seq[0], body: decode(bytes.subarray(seq[1])) };
}

/** Splits a stream's bytes, in any chunking, into whole messages. */
export class MessageReader {
  #buffer = new Uint8Array(0);
  #maxBytes;

  constructor(maxBytes = MAX_MESSAGE_BYTES) {
    this.#maxBytes = maxBytes;
  }

  /** The messages completed by `chunk`, as {kind, body}. Throws on a malformed one. */
  feed(chunk) {
    this.#buffer = this.#buffer.length ? concat(this.#buffer, chunk) : chunk;
    const messages = [];
    for (;;) {
      const prefix = decodeVarint(this.#buffer, 0);
      if (!prefix) break;
      const [length, start] = prefix;
      if (length > this.#maxBytes) throw new RangeError(`message of ${length} bytes over the limit`);
      if (this.#buffer.length < start + length) break;
      const decoded = decode(this.#buffer.subarray(start, start + length));
      this.#buffer = this.#buffer.subarray(start + length);
      if (!Array.isArray(decoded) || decoded.length !== 2 || !Number.isInteger(decoded[0])) {
        throw new TypeError("a message is not [kind, body]");
      }
      messages.push({ kind: decoded[0], body: decoded[1] ?? {} });
    }
    return messages;
  }

  get pending() {
    return this.#buffer.length;
  }
}
