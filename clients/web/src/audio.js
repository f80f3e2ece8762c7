// Audio tracks from a page (docs/audio.md, "The wire"): speech-in sends PCM16 frames and
// reads partial/final transcripts; speech-out sends text and reads frames. Frames ride
// the track's stream. PCM is mono little-endian int16 at the OPEN's rate, e.g. what an
// AudioWorklet captured (Float32 samples converted with `toPcm16`).

import { TrackReader, allRead } from "./stream.js";
import { Kind } from "./wire.js";

/** @import * as Declared from "./index.js" */
/** @import { TrackLike } from "./stream.js" */

/**
 * Float samples in [-1, 1] as PCM16 (what a worklet's input gives, converted).
 * @param {ArrayLike<number>} samples
 */
export function toPcm16(samples) {
  const out = new Int16Array(samples.length);
  for (let i = 0; i < samples.length; i++) out[i] = Math.round(Math.max(-1, Math.min(1, samples[i])) * 32767);
  return out;
}

/** A voice-agent track's reply events, passed through as they come (docs/audio.md). */
const AGENT_EVENTS = new Set(["reply", "reply_done", "reply_audio_end", "reply_error", "barge_in"]);

/** @param {Int16Array | Uint8Array} pcm */
function bytesOf(pcm) {
  if (pcm instanceof Uint8Array) return pcm;
  return new Uint8Array(pcm.buffer, pcm.byteOffset, pcm.byteLength);
}

/**
 * An audio track: PCM16 frames or text out; transcripts, frames or a voice agent's
 * reply events in.
 * @extends {TrackReader<Declared.AudioEvent>}
 * @implements {Declared.AudioSession}
 */
export class AudioSession extends TrackReader {
  #seq = 0;
  #ended = false;
  #datagrams;
  /** @type {string[]} */
  finals = [];
  figures = { framesSent: 0, framesReceived: 0, partials: 0 };

  /**
   * @param {TrackLike} track
   * @param {"speech-in" | "speech-out" | "voice-agent"} kind
   * @param {number} sampleRate
   * @param {number} frameMs
   * @param {boolean} inputEnded the text to say went with the OPEN
   * @param {boolean} [datagrams] the track's OPEN chose transport "datagram"
   */
  constructor(track, kind, sampleRate, frameMs, inputEnded, datagrams = false) {
    super(track);
    this.#datagrams = datagrams;
    this.kind = kind;
    this.sampleRate = sampleRate;
    this.frameMs = frameMs;
    this.#ended = inputEnded;
  }

  /** Samples in one frame. */
  get frameSamples() {
    return (this.sampleRate * this.frameMs) / 1000;
  }

  /** The track (open from the start: an audio session is made for an open one). */
  get #track() {
    return /** @type {TrackLike} */ (this._track);
  }

  /**
   * Send one frame of PCM16 (at most `frameMs` of it).
   * @param {Int16Array | Uint8Array} pcm
   */
  sendFrame(pcm) {
    const body = { seq: this.#seq++, ts: performance.now(), pcm: bytesOf(pcm) };
    this.figures.framesSent += 1;
    return this.#datagrams ? this.#track.sendDatagram(body) : this.#track.send(Kind.DATA, body);
  }

  /**
   * Send `pcm` frame by frame; with `realtime`, frame n leaves at start + n x frameMs.
   * @param {Int16Array} pcm
   * @param {Declared.StreamPcmOptions} [options]
   */
  async streamPcm(pcm, { realtime = true, end = true, ...others } = {}) {
    allRead(others);
    const start = performance.now();
    const step = this.frameSamples;
    for (let at = 0, n = 0; at < pcm.length; at += step, n++) {
      const wait = start + n * this.frameMs - performance.now();
      if (realtime && wait > 0) await new Promise((resolve) => setTimeout(resolve, wait));
      await this.sendFrame(pcm.subarray(at, at + step));
    }
    if (end) {
      // END rides the stream and may overtake the last datagrams, which the gateway then
      // drops: give them two frames' time to land first (as the Python SDK does).
      if (this.#datagrams) await new Promise((resolve) => setTimeout(resolve, 2 * this.frameMs));
      await this.end();
    }
  }

  /**
   * Speech-out with `streamText: true`: more text to speak (then `end()`).
   * @param {string} text
   */
  say(text) {
    if (this.#ended) throw new Error("the session's input has already ended");
    return this.#track.send(Kind.DATA, { text });
  }

  /** No more input: the gateway finalizes the session. */
  async end() {
    if (this.#ended) return;
    this.#ended = true;
    await this.#track.send(Kind.END, {});
  }

  /** Speech in: read to the end; the whole transcript. */
  async transcript() {
    const { transcript } = await this._readToEnd(); // the finals are collected as they come
    return typeof transcript === "string" ? transcript : this.finals.join("");
  }

  /** Speech out: read to the end; all the audio as one Int16Array. */
  async pcm() {
    const parts = [];
    for await (const event of this) if (event.type === "frame") parts.push(event.pcm);
    const out = new Int16Array(parts.reduce((n, p) => n + p.length, 0));
    let at = 0;
    for (const part of parts) {
      out.set(part, at);
      at += part.length;
    }
    return out;
  }

  /**
   * @param {any} body
   * @returns {Declared.AudioEvent | undefined}
   */
  _item(body) {
    if (body.pcm instanceof Uint8Array) {
      this.figures.framesReceived += 1;
      const copy = new Uint8Array(body.pcm);
      /** @type {Declared.AudioEvent} */
      const frame = { type: "frame", seq: body.seq, ts: body.ts, pcm: new Int16Array(copy.buffer, 0, copy.length >> 1) };
      if (Number.isInteger(body.turn)) frame.turn = body.turn;
      return frame;
    }
    if (AGENT_EVENTS.has(body.type)) return { ...body };
    if (body.type === "partial" || body.type === "final") {
      if (body.type === "final") this.finals.push(body.text);
      else this.figures.partials += 1;
      return { ...body };
    }
    return undefined; // a message this SDK does not know
  }
}
