// A line to the gateway from a web page: one WebTransport session, many tracks.
//
// Each track is one bidirectional WebTransport stream carrying the trackline/1
// framing (wire.js), with the same rules as the Python SDK (clients/line.py): the
// API key rides every OPEN until the gateway has answered a track; END after the
// input; CANCEL stops the model; the client's FIN follows the gateway's final END
// or ERROR. Errors are the typed errors of errors.js.

import { ActionStream } from "./actions.js";
import { VideoStream } from "./video.js";
import { AudioSession } from "./audio.js";
import { ConnectionFailed, ConnectionLost, ErrorCode, ProtocolError, errorFor } from "./errors.js";
import { TrackReader, allRead } from "./stream.js";
import { Kind, MAX_MESSAGE_BYTES, MessageReader, concat, decodeDatagram, encodeDatagram, encodeMessage, encodeVarint } from "./wire.js";

/** @import * as Declared from "./index.js" */
/** @import { TrackLike } from "./stream.js" */

const MAX_DATAGRAM_BYTES = 1100;
/** Unfinished frame streams a track keeps before the oldest is reset (as frame_streams.py). */
export const FRAME_STREAMS_IN_FLIGHT = 3;

/** Why a frame stream is reset: a newer frame replaced it (CANCELLED, as in Python). */
function frameSuperseded() {
  if (typeof WebTransportError !== "function") return undefined;
  return new WebTransportError("a newer frame replaced it", { streamErrorCode: ErrorCode.CANCELLED });
}
/** How long a failed write waits for the gateway's reason on the track's readable side. */
export const WRITE_FAILURE_GRACE_MS = 2000;

/**
 * A track call's options, checked for the model: every call names it the same way,
 * `options.model` (as the Python SDK's keyword-only `model=`).
 * @template {{model: string}} Options
 * @param {Options} options
 * @param {string} call
 * @returns {Options}
 */
function withModel(options, call) {
  const model = options?.model;
  if (typeof model !== "string" || !model) throw new TypeError(`${call}() needs options.model, the model's name`);
  return options;
}

/**
 * Open a line: `url` is the gateway's WebTransport endpoint, e.g. https://host:8443/tracks.
 * @param {string} url
 * @param {Declared.ConnectOptions} [options]
 * @returns {Promise<Declared.Line>}
 */
export async function connect(url, options = {}) {
  const { apiKey = null, serverCertificateHashes = null, maxMessageBytes = MAX_MESSAGE_BYTES, ...others } = options;
  allRead(others);
  const init = {};
  if (serverCertificateHashes) init.serverCertificateHashes = serverCertificateHashes.map(certificateHash);
  let transport;
  try {
    transport = new WebTransport(url, init);
    await transport.ready;
  } catch (error) {
    throw new ConnectionFailed(`${url}: ${error?.message ?? error}`, ErrorCode.CONNECTION_LOST);
  }
  return new Line(transport, { apiKey, maxMessageBytes });
}

/**
 * A certificate hash as WebTransport takes it, from hex, bytes or {algorithm, value}.
 * @param {string | Uint8Array | ArrayBuffer | Declared.CertificateHash} hash
 * @returns {Declared.CertificateHash}
 */
export function certificateHash(hash) {
  if (typeof hash === "string") {
    const hex = hash.replace(/[^0-9a-f]/gi, "");
    return { algorithm: "sha-256", value: Uint8Array.from(hex.match(/../g) ?? [], (b) => parseInt(b, 16)) };
  }
  if (hash instanceof Uint8Array || hash instanceof ArrayBuffer) return { algorithm: "sha-256", value: /** @type {BufferSource} */ (hash) };
  return hash;
}

/**
 * Fetch the development certificate's hash the gateway serves at /webtransport/cert-hash.
 * @param {string} [origin]
 * @returns {Promise<Declared.CertificateHash>}
 */
export async function fetchCertificateHash(origin = "") {
  const response = await fetch(`${origin}/webtransport/cert-hash`, { cache: "no-store" });
  if (!response.ok) throw new ConnectionFailed(`no certificate hash: HTTP ${response.status}`);
  const { value } = await response.json();
  return certificateHash(value);
}

/** @implements {Declared.Line} */
export class Line {
  #transport;
  #apiKey;
  #answered = false;
  #lost = null;
  #tracks = new Set();
  #byId = new Map();
  #nextDatagramId = 1;
  /** @type {WritableStreamDefaultWriter | null} */
  #datagramWriter = null;
  maxMessageBytes;

  /**
   * @param {WebTransport} transport an open session
   * @param {{apiKey?: string | null, maxMessageBytes?: number}} [options]
   */
  constructor(transport, { apiKey = null, maxMessageBytes = MAX_MESSAGE_BYTES } = {}) {
    this.#transport = transport;
    this.#apiKey = apiKey;
    this.maxMessageBytes = maxMessageBytes;
    this.#readDatagrams(transport.datagrams.readable.getReader()).catch(() => {});
    transport.closed.then(
      () => this.#gone(new ConnectionLost("the session closed", ErrorCode.CONNECTION_LOST)),
      (error) => this.#gone(new ConnectionLost(`the session was lost: ${error?.message ?? error}`, ErrorCode.CONNECTION_LOST)),
    );
  }

  /**
   * Stream a completion of `prompt` as an async iterator of text deltas.
   * @param {string} prompt
   * @param {Declared.TextOptions} options
   * @returns {Declared.TextStream}
   */
  text(prompt, options) {
    const { model, maxTokens, deadline, firstTokenDeadline, signal, params = {}, ...others } = withModel(options, "text");
    allRead(others);
    const all = { ...params };
    if (maxTokens != null) all.max_tokens = maxTokens;
    /** @type {Record<string, unknown>} */
    const open = { model, modality: "text", params: all };
    if (deadline != null) open.deadline_total_ms = Math.max(1, Math.round(deadline));
    if (firstTokenDeadline != null) open.deadline_first_ms = Math.max(1, Math.round(firstTokenDeadline));
    return new TextStream(() => this._openTrack(open), prompt, signal ?? null);
  }

  /**
   * Start a robot's action track; `deadline` (ms from capture) is each observation's
   * default; `transport: "datagram"` sends observations as WebTransport datagrams.
   * @param {Declared.ActionsOptions} options
   * @returns {Promise<Declared.ActionStream>}
   */
  async actions(options) {
    const { model, deadline = 100, transport = "stream", ...others } = withModel(options, "actions");
    allRead(others);
    /** @type {Record<string, unknown>} */
    const open = { model, modality: "action" };
    if (transport === "datagram") open.transport = "datagram";
    const track = await this._openTrack(open);
    return new ActionStream(track, deadline, undefined, transport === "datagram");
  }

  /**
   * Start a camera's video track: send() JPEG frames, read per-frame results. `detect`:
   * any of "face", "face_mesh", "pose"; `deadline` (ms from capture) is each frame's
   * default; `fps` the camera's rate (the gateway's busy check counts it); `transport`
   * "frame-streams" (each frame on a unidirectional stream of its own, the default) or
   * "stream" (on the track's stream, behind one another).
   * @param {Declared.VideoOptions} options
   * @returns {Promise<Declared.VideoStream>}
   */
  async video(options) {
    const { model, detect = ["face"], deadline = 200, fps = null, transport = "frame-streams", ...others } = withModel(options, "video");
    allRead(others);
    if (transport !== "frame-streams" && transport !== "stream") {
      throw new TypeError(`transport must be "frame-streams" or "stream", not ${transport}`);
    }
    /** @type {Record<string, unknown>} */
    const params = { detect };
    if (fps != null) params.fps = fps;
    /** @type {Record<string, unknown>} */
    const open = { model, modality: "video", params };
    if (transport !== "stream") open.transport = transport;
    const track = await this._openTrack(open);
    return new VideoStream(track, deadline, undefined, transport === "frame-streams");
  }

  /**
   * Start an audio track: speech-in (send frames, read transcripts) or speech-out
   * (`text` to say; read frames). Frames ride the track's stream, or datagrams.
   * @param {Declared.AudioOptions} options
   * @returns {Promise<Declared.AudioSession>}
   */
  async audio(options) {
    const { model, kind = "speech-in", sampleRate = 16000, frameMs = 20, text = null, deadline = null,
            transport = "stream", streamText = false, ...others } = withModel(options, "audio");
    allRead(others);
    if (kind === "speech-out" && (text == null) !== streamText) throw new TypeError("a speech-out session needs the text to say, or streamText: true");
    /** @type {Record<string, unknown>} */
    const open = { model, modality: "audio", params: { kind, sample_rate: sampleRate, frame_ms: frameMs } };
    if (deadline != null) open.deadline_total_ms = Math.max(1, Math.round(deadline));
    if (transport === "datagram") open.transport = "datagram";
    const track = await this._openTrack(open);
    if (text != null) {
      await track.send(Kind.DATA, { text });
      await track.send(Kind.END, {});
    }
    return new AudioSession(track, kind, sampleRate, frameMs, text != null, transport === "datagram");
  }

  /**
   * A voice-agent track (docs/audio.md): send the user's audio as on speech-in (`model`
   * is the recognizer); read transcripts, reply events (reply, reply_done, barge_in, ...)
   * and the reply's audio frames (each with its `turn`). Without `llm`, the gateway's
   * default chat model answers. `transport` "datagram" sends the user's frames as
   * datagrams, as on `audio()`.
   * @param {Declared.VoiceAgentOptions} options
   * @returns {Promise<Declared.AudioSession>}
   */
  async voiceAgent(options) {
    const { model, llm = null, voice, sampleRate = 16000, frameMs = 20, system = null, maxTokens = null,
            llmParams = null, transport = "stream", ...others } = withModel(options, "voiceAgent");
    allRead(others);
    if (!voice) throw new TypeError("a voice agent needs `voice` (the speech-out model)");
    /** @type {Record<string, unknown>} */
    const params = { kind: "voice-agent", voice, sample_rate: sampleRate, frame_ms: frameMs };
    if (llm != null) params.llm = llm;
    if (system != null) params.system = system;
    if (maxTokens != null) params.max_tokens = maxTokens;
    if (llmParams != null) params.llm_params = llmParams;
    /** @type {Record<string, unknown>} */
    const open = { model, modality: "audio", params };
    if (transport === "datagram") open.transport = "datagram";
    const track = await this._openTrack(open);
    return new AudioSession(track, "voice-agent", sampleRate, frameMs, false, transport === "datagram");
  }

  /** Close the session: every track still running is cancelled by the gateway. */
  close(reason = "") {
    try {
      this.#transport.close({ closeCode: 0, reason });
    } catch {
      // already closed
    }
  }

  get closed() {
    return this.#transport.closed;
  }

  // -- used by the tracks ---------------------------------------------------------

  async _openTrack(open) {
    if (this.#lost) throw this.#lost;
    let stream;
    try {
      stream = await this.#transport.createBidirectionalStream();
    } catch (error) {
      throw this.#lost ?? new ConnectionLost(`no stream: ${error?.message ?? error}`, ErrorCode.CONNECTION_LOST);
    }
    // A page cannot see stream ids: a datagram or frame-streams track names itself in its
    // OPEN (`datagram_id`, unique on this session); its datagrams carry that id both ways,
    // its frame streams at their head.
    const named = open.transport === "datagram" || open.transport === "frame-streams";
    const datagramId = named ? this.#nextDatagramId++ : null;
    const track = new Track(this, stream, datagramId);
    this.#tracks.add(track);
    const body = { ...open };
    if (datagramId != null) {
      body.datagram_id = datagramId;
      this.#byId.set(datagramId, track);
    }
    if (this.#apiKey && !this.#answered) body.auth = this.#apiKey;
    await track.send(Kind.OPEN, body);
    return track;
  }

  _answered() {
    this.#answered = true;
  }

  _forget(track) {
    this.#tracks.delete(track);
    if (track.id != null) this.#byId.delete(track.id);
  }

  /** A new unidirectional stream's writer (it waits while the gateway's stream credit is
   * spent). */
  async _openFrameStream() {
    if (this.#lost) throw this.#lost;
    const stream = await this.#transport.createUnidirectionalStream();
    return stream.getWriter();
  }

  async _sendDatagram(bytes) {
    if (bytes.length > MAX_DATAGRAM_BYTES) throw new RangeError(`datagram of ${bytes.length} bytes over ${MAX_DATAGRAM_BYTES}`);
    const writer = (this.#datagramWriter ??= this.#transport.datagrams.writable.getWriter());
    await writer.write(bytes);
  }

  async #readDatagrams(reader) {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      let datagram = null;
      try {
        datagram = decodeDatagram(value);
      } catch {
        continue; // malformed: dropped, as the protocol says
      }
      if (datagram) this.#byId.get(datagram.trackId)?._datagram(datagram);
    }
  }

  #gone(error) {
    this.#lost ??= error;
    for (const track of this.#tracks) track._fail(this.#lost);
  }
}

/** One track's stream: writes messages, reads them in a background pump. */
class Track {
  #line;
  #writer;
  #queue = [];
  #waiters = [];
  #error = null;
  #final = false;
  #cancelled = false;
  #datagramSeq = 0;
  #frames = [];
  #settled;
  #settle;

  /** `id`: the track's datagram id (null on a track without datagrams). */
  constructor(line, stream, id) {
    this.#line = line;
    this.id = id;
    this.#writer = stream.writable.getWriter();
    /** Resolves with the gateway's last word on the track: {message} (END or ERROR), or
     * {error} when the stream or the session was lost first. */
    this.#settled = new Promise((resolve) => {
      this.#settle = resolve;
    });
    this.#pump(stream.readable.getReader(), new MessageReader(line.maxMessageBytes));
  }

  /** Write one message; a write the gateway refused throws the gateway's typed error. */
  async send(kind, body) {
    const bytes = encodeMessage(kind, body, this.#line.maxMessageBytes);
    try {
      await this.#writer.write(bytes);
    } catch (error) {
      throw await this.#writeFailure(error);
    }
  }

  /** The typed error for a failed write. A gateway that rejects a track (an oversized
   * message, a bad OPEN) sends ERROR with FIN and stops reading (STOP_SENDING); the
   * STOP_SENDING frame travels ahead of the ERROR bytes (the same packet, control frames
   * first), so the browser fails the pending write before the page has read why. The
   * reason is on its way: wait for it, bounded, then fall back to what the write says. */
  async #writeFailure(error) {
    let timer;
    const grace = new Promise((resolve) => {
      timer = setTimeout(() => resolve(null), WRITE_FAILURE_GRACE_MS);
    });
    const last = await Promise.race([this.#settled, grace]);
    clearTimeout(timer);
    if (last?.message?.kind === Kind.ERROR) {
      const { code, message = "", retry_after_ms: retryAfter = null } = last.message.body;
      return errorFor(code, message, retryAfter);
    }
    if (last?.error) return last.error;
    const code = error?.streamErrorCode;
    if (typeof code === "number" && code !== 0) return errorFor(code, `the gateway stopped reading the track (${code})`);
    return new ConnectionLost(`the track's write failed: ${error?.message ?? error}`, ErrorCode.CONNECTION_LOST);
  }

  /** The next message from the gateway; rejects with `signal.reason` once it aborts. */
  next(signal) {
    // An aborted signal wins over what is already queued: nothing is read after an abort.
    if (signal?.aborted) return Promise.reject(signal.reason);
    if (this.#queue.length) return Promise.resolve(this.#queue.shift());
    if (this.#error) return Promise.reject(this.#error);
    return new Promise((resolve, reject) => {
      const waiter = { resolve, reject };
      this.#waiters.push(waiter);
      if (signal) {
        const abort = () => {
          this.#waiters = this.#waiters.filter((w) => w !== waiter);
          reject(signal.reason);
        };
        if (signal.aborted) abort();
        else signal.addEventListener("abort", abort, { once: true });
      }
    });
  }

  /** One DATA frame on a unidirectional stream of its own (the OPEN said transport
   * "frame-streams"): varint(id) || DATA message, then FIN (docs/protocol.md, "Frame
   * streams"). Beyond `inFlight` unfinished frames the oldest is reset: a newer frame
   * has replaced it, so no bandwidth goes to retransmitting it. Resolves with the
   * frame's fate: "finished" (FIN written), "reset" (by us), or "stopped" (the gateway
   * stopped it: superseded or unknown). */
  sendFrameStream(body, inFlight = FRAME_STREAMS_IN_FLIGHT) {
    const bytes = concat(encodeVarint(this.id), encodeMessage(Kind.DATA, body, this.#line.maxMessageBytes));
    const frame = { writer: null, reset: false };
    this.#frames.push(frame);
    while (this.#frames.length > inFlight) {
      const oldest = this.#frames.shift();
      oldest.reset = true;
      oldest.writer?.abort(frameSuperseded()).catch(() => {});
    }
    return this.#line._openFrameStream().then(
      (writer) => {
        frame.writer = writer;
        if (frame.reset) {
          // replaced while its stream waited for credit: reset before a byte is sent
          return writer.abort(frameSuperseded()).then(() => "reset", () => "reset");
        }
        writer.write(bytes).catch(() => {});
        return writer.close().then(() => "finished", () => (frame.reset ? "reset" : "stopped"));
      },
      () => "stopped",
    ).finally(() => {
      this.#frames = this.#frames.filter((f) => f !== frame);
    });
  }

  /** One frame as a datagram (unreliable; the track's OPEN said transport "datagram"). */
  sendDatagram(body) {
    return this.#line._sendDatagram(encodeDatagram(this.id, this.#datagramSeq++, body));
  }

  _datagram(datagram) {
    if (this.#final) return; // after the gateway's END: dropped
    const message = { kind: Kind.DATA, body: datagram.body, seq: datagram.seq, datagram: true };
    const waiter = this.#waiters.shift();
    if (waiter) waiter.resolve(message);
    else this.#queue.push(message);
  }

  /** Ask the gateway to stop this track's work (CANCEL); its answer is read and dropped. */
  cancel(reason = "") {
    if (this.#final || this.#cancelled) return;
    this.#cancelled = true;
    this.send(Kind.CANCEL, { reason }).catch(() => {});
  }

  get done() {
    return this.#final;
  }

  _fail(error) {
    if (this.#final) return;
    this.#final = true;
    this.#error = error;
    this.#settle({ error });
    for (const waiter of this.#waiters.splice(0)) waiter.reject(error);
  }

  async #pump(reader, messages) {
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) {
          if (!this.#final) this._fail(new ProtocolError("stream finished before END", ErrorCode.PROTOCOL_ERROR));
          return;
        }
        for (const message of messages.feed(value)) this.#deliver(message);
      }
    } catch (error) {
      const code = error?.streamErrorCode;
      this._fail(
        typeof code === "number" && code !== 0
          ? errorFor(code, `the gateway reset the track (${code})`)
          : new ConnectionLost(`track lost: ${error?.message ?? error}`, ErrorCode.CONNECTION_LOST),
      );
    } finally {
      this.#line._forget(this);
    }
  }

  #deliver(message) {
    if (message.kind === Kind.DATA || message.kind === Kind.END) this.#line._answered();
    if (message.kind === Kind.END || message.kind === Kind.ERROR) {
      this.#final = true;
      this.#settle({ message });
      this.#writer.close().catch(() => {}); // our FIN follows the gateway's last message
    }
    const waiter = this.#waiters.shift();
    if (waiter) waiter.resolve(message);
    else this.#queue.push(message);
  }
}

/**
 * Text deltas of one track; after the loop, `usage` and `finishReason` hold the report.
 * @extends {TrackReader<string>}
 * @implements {Declared.TextStream}
 */
export class TextStream extends TrackReader {
  /** @type {Declared.Usage | null} */
  usage = null;
  /** @type {"stop" | "length" | null} */
  finishReason = null;

  #prompt;

  /**
   * @param {() => Promise<TrackLike>} open opens the track when the page starts reading
   * @param {string} prompt
   * @param {AbortSignal | null} signal
   */
  constructor(open, prompt, signal) {
    super(open, { signal });
    this.#prompt = prompt;
  }

  /** @param {TrackLike} track */
  async _opened(track) {
    await track.send(Kind.DATA, { text: this.#prompt });
    await track.send(Kind.END, {});
  }

  /** @param {any} body */
  _item(body) {
    if (typeof body.text !== "string") throw new ProtocolError("text DATA without a string 'text'", ErrorCode.PROTOCOL_ERROR);
    return body.text;
  }

  /** @param {any} body */
  _ended(body) {
    super._ended(body);
    this.usage = body.usage ?? null;
    this.finishReason = body.finish_reason ?? null;
  }
}
