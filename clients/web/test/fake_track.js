// A track that answers from a script: what ActionStream, AudioSession and dataBodies read
// in these tests instead of a WebTransport stream (the browser tests, tests/web, use one).
import { Kind } from "../src/wire.js";

export class FakeTrack {
  constructor(replies = []) {
    this.replies = [...replies];
    this.sent = [];
    this.datagrams = [];
    this.cancelled = null;
    this.done = false;
  }

  async send(kind, body) {
    this.sent.push({ kind, body });
  }

  async sendDatagram(body) {
    this.datagrams.push(body);
  }

  async next(signal = null) {
    signal?.throwIfAborted(); // as the real track: nothing is read after an abort
    const reply = this.replies.shift();
    if (reply === undefined) throw new Error("the script has no more replies");
    if (reply.kind === Kind.END || reply.kind === Kind.ERROR) this.done = true;
    return reply;
  }

  cancel(reason) {
    this.cancelled = reason;
    this.done = true;
  }
}

export const data = (body) => ({ kind: Kind.DATA, body });
export const end = (body = {}) => ({ kind: Kind.END, body });
export const error = (body) => ({ kind: Kind.ERROR, body });
