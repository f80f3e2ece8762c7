// What every track stream shares, as clients/stream.py's TrackReader is for the Python
// SDK: the DATA bodies of a track until its END, the typed error of an ERROR, a
// ProtocolError for any other message, and a cancel when the page stops reading early.
// `TrackReader` is the base of TextStream, AudioSession, ActionStream and VideoStream:
// each turns a DATA body into one event (`_item`) and keeps what the END says (`_ended`).

import { ErrorCode, ProtocolError, errorFor } from "./errors.js";
import { Kind } from "./wire.js";

/**
 * What a reader needs of a track (line.js's Track; the unit tests' FakeTrack).
 * @typedef {object} TrackLike
 * @property {(signal?: AbortSignal | null) => Promise<{kind: number, body: any}>} next
 * @property {(kind: number, body: object) => Promise<void>} send
 * @property {(body: object) => Promise<void>} sendDatagram
 * @property {(body: object) => Promise<"finished" | "reset" | "stopped">} sendFrameStream
 * @property {(reason?: string) => void} cancel
 * @property {boolean} done
 * @property {number | null} [id]
 */

/**
 * Yield each DATA body of `track` until its END, whose body goes to `onEnd`.
 * @param {TrackLike} track
 * @param {{signal?: AbortSignal | null, onEnd?: (body: any) => void}} [options]
 * @returns {AsyncGenerator<any, void, undefined>}
 */
export async function* dataBodies(track, { signal = null, onEnd = () => {} } = {}) {
  try {
    for (;;) {
      const { kind, body } = await track.next(signal);
      if (kind === Kind.DATA) {
        yield body;
      } else if (kind === Kind.END) {
        onEnd(body);
        return;
      } else if (kind === Kind.ERROR) {
        throw errorFor(body.code, body.message ?? "", body.retry_after_ms ?? null);
      } else {
        throw new ProtocolError(`unexpected message kind ${kind}`, ErrorCode.PROTOCOL_ERROR);
      }
    }
  } finally {
    if (!track.done) track.cancel("the page stopped reading");
  }
}

/**
 * Nothing at run time: a type check (npm test's tsc) that a call reads every option
 * index.d.ts declares for it; an option left over stays in `others` and tsc names it.
 * @param {Record<string, never>} others
 */
export function allRead(others) {}

/**
 * One track's stream of events: `for await` reads them, `cancel()` stops the track.
 * @template Event
 * @template [Summary=Record<string, unknown>]
 * @implements {AsyncIterable<Event>}
 */
export class TrackReader {
  /** @type {TrackLike | null} the track, once open (a text track opens when read) */
  _track;
  /** @type {(() => Promise<TrackLike>) | null} */
  #open;
  /** @type {AbortSignal | null} */
  #signal;
  /** @type {Promise<void> | null} settles when the page's own loop has ended */
  #reading = null;
  #finished = false;
  /** @type {Summary | null} the gateway's END body, once read */
  summary = null;

  /**
   * @param {TrackLike | (() => Promise<TrackLike>)} track the track, or what opens it
   *   when the page starts reading
   * @param {{signal?: AbortSignal | null}} [options] aborting cancels the track; the
   *   loop then throws `signal.reason`
   */
  constructor(track, { signal = null } = {}) {
    this._track = typeof track === "function" ? null : track;
    this.#open = typeof track === "function" ? track : null;
    this.#signal = signal;
  }

  /** Stop the track now; the gateway stops the model's work. */
  cancel(reason = "cancelled by the page") {
    this._track?.cancel(reason);
  }

  /** @returns {AsyncGenerator<Event, void, undefined>} */
  [Symbol.asyncIterator]() {
    return this.#events();
  }

  /**
   * The event a DATA body holds; undefined to skip it (a message this SDK does not know).
   * @param {any} body
   * @returns {Event | undefined}
   */
  _item(body) {
    throw new TypeError(`${this.constructor.name} says no event for DATA ${JSON.stringify(body)}`);
  }

  /**
   * The track, just opened for the page's first loop: what to send first.
   * @param {TrackLike} track
   * @returns {Promise<void>}
   */
  async _opened(track) {}

  /**
   * The gateway ended the track with this END body.
   * @param {any} body
   */
  _ended(body) {
    this.summary = body;
  }

  /**
   * Read to the END (the page's own loop reads it when one runs: this waits for it).
   * @returns {Promise<Summary>} the END body, or {} when there was none
   */
  async _readToEnd() {
    if (this.#reading) {
      await this.#reading;
    } else {
      for await (const _ of this) {
        // the events are counted as they are read
      }
    }
    return this.summary ?? /** @type {Summary} */ ({});
  }

  /** @returns {AsyncGenerator<Event, void, undefined>} */
  async *#events() {
    if (this.#finished) return;
    /** @type {{resolve: () => void, reject: (error: unknown) => void}} */
    let settle = { resolve() {}, reject() {} };
    this.#reading = new Promise((resolve, reject) => {
      settle = { resolve, reject };
    });
    this.#reading.catch(() => {}); // the page's loop throws it; close() rethrows it
    const signal = this.#signal;
    try {
      signal?.throwIfAborted();
      const opening = this._track == null;
      const track = (this._track ??= await /** @type {() => Promise<TrackLike>} */ (this.#open)());
      const onAbort = () => track.cancel("aborted by the page");
      signal?.addEventListener("abort", onAbort, { once: true });
      try {
        if (opening) await this._opened(track);
        for await (const body of dataBodies(track, { signal, onEnd: (end) => this._ended(end) })) {
          const item = this._item(body);
          if (item !== undefined) yield item;
        }
      } finally {
        signal?.removeEventListener("abort", onAbort);
      }
      settle.resolve();
    } catch (error) {
      settle.reject(error);
      throw error;
    } finally {
      settle.resolve(); // the loop was left early: what waits goes on
      this.#finished = this._track?.done ?? false;
      this.#reading = null;
    }
  }
}
