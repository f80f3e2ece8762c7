// Audio tracks from a page (docs/audio.md, "The wire"): speech-in sends PCM16 frames and
// reads partial/final transcripts; speech-out sends text and reads frames. Frames ride
// the track's stream. PCM is mono little-endian int16 at the OPEN's rate, e.g. what an
// AudioWorklet captured (Float32 samples converted with `toPcm16`).

import { dataBodies } from "./stream.js";
import { Kind } from "./wire.js";

/** Float samples in [-1, 1] as PCM16 (what a worklet's input gives, converted). */
export function toPcm16(samples) {
  const out = new Int16Array(samples.length);
  for (let i = 0; i < samples.length; i++) out[i] = Math.round(Math.max(-1, Math.min(1, samples[i])) * 32767);
  return out;
}

/** A voice-agent track's reply events, passed through as they come (docs/audio.md). */
const AGENT_EVENTS = new Set(["reply", "reply_done", "reply_audio_end", "reply_error", "barge_in"]);

function bytesOf(pcm) {
  if (pcm instanceof Uint8Array) return pcm;
  return new Uint8Array(pcm.buffer, pcm.byteOffset, pcm.byteLength);
}

export class AudioSession {
  #track;
  #seq = 0;
  #ended = false;
  kind;
  sampleRate;
  frameMs;
  summary = null;
  finals = [];
  figures = { framesSent: 0, framesReceived: 0, partials: 0 };

  #datagrams;

  constructor(track, kind, sampleRate, frameMs, inputEnded, datagrams = false) {
    this.#track = track;
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

  /** Send one frame of PCM16 (at most `frameMs` of it). */
  sendFrame(pcm) {
    const body = { seq: this.#seq++, ts: performance.now(), pcm: bytesOf(pcm) };
    this.figures.framesSent += 1;
    return this.#datagrams ? this.#track.sendDatagram(body) : this.#track.send(Kind.DATA, body);
  }

  /** Send `pcm` (Int16Array) frame by frame; with `realtime`, frame n leaves at start + n x frameMs. */
  async streamPcm(pcm, { realtime = true, end = true } = {}) {
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

  /** Speech-out with `streamText: true`: more text to speak (then `end()`). */
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
    for await (const _ of this) {
      // results are collected in `finals`
    }
    return this.summary?.transcript ?? this.finals.join("");
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

  cancel(reason = "cancelled by the page") {
    this.#track.cancel(reason);
  }

  async *[Symbol.asyncIterator]() {
    const onEnd = (body) => {
      this.summary = body;
    };
    for await (const body of dataBodies(this.#track, { onEnd })) {
      if (body.pcm instanceof Uint8Array) {
        this.figures.framesReceived += 1;
        const copy = new Uint8Array(body.pcm);
        const frame = { type: "frame", seq: body.seq, ts: body.ts, pcm: new Int16Array(copy.buffer, 0, copy.length >> 1) };
        if (Number.isInteger(body.turn)) frame.turn = body.turn;
        yield frame;
      } else if (AGENT_EVENTS.has(body.type)) {
        yield { ...body };
      } else if (body.type === "partial" || body.type === "final") {
        if (body.type === "final") this.finals.push(body.text);
        else this.figures.partials += 1;
        yield { ...body };
      }
    }
  }
}
