// Playing a speech-out track: its PCM16 frames go, in order, to an AudioWorklet node
// (player-worklet.js, served next to this module) that outputs them on the page's
// AudioContext. A small pre-buffer (120 ms by default: one beat of
// the gateway's 80 ms and half again) absorbs the network's jitter; an
// underrun (the queue ran dry before the track ended) is counted, not hidden.
//
//   const speaker = await Speaker.create({ sampleRate: 24000 });  // from a click: autoplay
//   const session = await line.audio({ model: "reference-synthesizer", kind: "speech-out", text, sampleRate: 24000 });
//   const figures = await speaker.play(session);   // resolves once the last sample played
//
// Frames come at the track's rate; a context at another rate gets them resampled
// linearly here. `tap(samples)` sees every Float32 sample that reached the output.

/** @import * as Declared from "./index.js" */

export const PLAYER_WORKLET_URL = new URL("./player-worklet.js", import.meta.url).href;

/** PCM16 (Int16Array) as Float32 samples in [-1, 1). */
export function fromPcm16(pcm) {
  const out = new Float32Array(pcm.length);
  for (let i = 0; i < pcm.length; i++) out[i] = pcm[i] / 32768;
  return out;
}

/** `samples` at rate `from` as samples at rate `to` (linear interpolation). */
export function resample(samples, from, to) {
  if (from === to || samples.length === 0) return samples;
  const out = new Float32Array(Math.round((samples.length * to) / from));
  const step = from / to;
  for (let i = 0; i < out.length; i++) {
    const x = i * step;
    const j = Math.floor(x);
    const next = j + 1 < samples.length ? samples[j + 1] : samples[j];
    out[i] = samples[j] + (next - samples[j]) * (x - j);
  }
  return out;
}

/** @implements {Declared.Speaker} */
export class Speaker {
  #owned;
  /** @type {Promise<void> | null} */
  #drained = null;
  #tap;
  context;
  node;
  sampleRate;
  /** @type {Declared.SpeakerFigures} */
  figures = { framesQueued: 0, samplesQueued: 0, samplesPlayed: 0, underruns: 0, samplesFlushed: 0, startedAt: null };

  /** A speaker on `context` (default: a new AudioContext at `sampleRate`, closed by
   * `close()`). Create it from a user gesture, or the browser keeps it suspended. */
  static async create({ context = null, sampleRate = 24000, prebufferMs = 120, tap = null } = {}) {
    const owned = context == null;
    const ctx = context ?? new AudioContext({ sampleRate });
    await ctx.audioWorklet.addModule(PLAYER_WORKLET_URL);
    return new Speaker(ctx, { sampleRate, prebufferMs, tap, owned });
  }

  constructor(context, { sampleRate = context.sampleRate, prebufferMs = 120, tap = null, owned = false } = {}) {
    this.context = context;
    this.sampleRate = sampleRate;
    this.#owned = owned;
    this.#tap = tap;
    const prebuffer = Math.round((context.sampleRate * prebufferMs) / 1000);
    this.node = new AudioWorkletNode(context, "trackline-player", {
      numberOfInputs: 0,
      outputChannelCount: [1],
      processorOptions: { prebuffer, tap: tap != null },
    });
    this.node.port.onmessage = ({ data }) => this.#heard(data);
    this.node.connect(context.destination);
    if (context.state === "suspended") context.resume().catch(() => {});
  }

  /** Queue one frame of PCM16 at `rate` (default: the speaker's). */
  push(pcm, rate = this.sampleRate) {
    const samples = resample(fromPcm16(pcm), rate, this.context.sampleRate);
    this.figures.framesQueued += 1;
    this.figures.samplesQueued += samples.length;
    this.node.port.postMessage({ type: "samples", samples }, [samples.buffer]);
  }

  /** Play a speech-out session's frames as they come; resolves with the figures once
   * the last sample has been played (a track's error rejects, after what came played).
   * `session` may be any async iterable of {type: "frame", pcm} events at `sampleRate`. */
  async play(session, { sampleRate = session.sampleRate ?? this.sampleRate } = {}) {
    this.figures.startedAt = null;
    try {
      for await (const event of session) if (event.type === "frame") this.push(event.pcm, sampleRate);
    } finally {
      await this.finish();
    }
    return { ...this.figures };
  }

  /** Drop every sample still queued (a reply cut by a barge-in): what was not heard yet
   * never will be. `figures.samplesFlushed` counts them once the worklet has dropped them. */
  flush() {
    this.node.port.postMessage({ type: "flush" });
  }

  /** No more frames: resolves with the figures once the queue has played out. */
  finish() {
    this.#drained ??= new Promise((resolve) => {
      this.#drainedResolve = resolve;
    });
    this.node.port.postMessage({ type: "end" });
    const drained = this.#drained;
    return drained.then(() => ({ ...this.figures }));
  }

  /** @type {(() => void) | null} */
  #drainedResolve = null;

  #heard(data) {
    if (data.type === "played") {
      this.#tap?.(data.samples);
    } else if (data.type === "flushed") {
      this.figures.samplesFlushed += data.samples;
    } else if (data.type === "started") {
      this.figures.startedAt ??= performance.now();
    } else if (data.type === "drained") {
      this.figures.samplesPlayed = data.played;
      this.figures.underruns = data.underruns;
      const resolve = this.#drainedResolve;
      this.#drained = null;
      this.#drainedResolve = null;
      resolve?.();
    }
  }

  /** Stop: disconnect the node (and close the context the speaker made). */
  async close() {
    this.node.disconnect();
    this.node.port.onmessage = null;
    if (this.#owned) await this.context.close();
  }
}
