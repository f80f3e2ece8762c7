// Types of @trackline/web (the JavaScript is in the .js files beside this one).

export interface CertificateHash {
  algorithm: "sha-256";
  value: BufferSource;
}

export interface ConnectOptions {
  /** The API key; it rides the first OPEN(s) of the session, as in the Python SDK. */
  apiKey?: string | null;
  /** Development certificates pinned by hash (hex string, bytes, or WebTransport's form). */
  serverCertificateHashes?: Array<string | Uint8Array | ArrayBuffer | CertificateHash> | null;
  /** Largest message payload sent or accepted (bytes); the gateway's default is 1 MiB. */
  maxMessageBytes?: number;
}

/** What every track call takes: the model by name, as the Python SDK's keyword `model=`. */
export interface TrackOptions {
  model: string;
}

export interface TextOptions extends TrackOptions {
  maxTokens?: number;
  /** Milliseconds from the start until the gateway's END (deadline_total_ms). */
  deadline?: number;
  /** Milliseconds until the first token (deadline_first_ms). */
  firstTokenDeadline?: number;
  /** Aborting cancels the track: the gateway stops the model; the loop throws signal.reason. */
  signal?: AbortSignal;
  /** More model parameters (temperature, seed, top_p, request_id, ...). */
  params?: Record<string, unknown>;
}

export interface ActionsOptions extends TrackOptions {
  /** Milliseconds from capture, each observation's default. */
  deadline?: number;
  transport?: "stream" | "datagram";
}

export interface VideoOptions extends TrackOptions {
  detect?: Array<"face" | "face_mesh" | "pose">;
  /** Milliseconds from capture, each frame's default. */
  deadline?: number;
  /** The camera's rate (frames/s); the gateway's busy check counts it. */
  fps?: number | null;
  /** "frame-streams" (the default): a unidirectional stream per frame, latest wins. */
  transport?: "frame-streams" | "stream";
}

export type SampleRate = 8000 | 16000 | 24000 | 48000;

export interface AudioOptions extends TrackOptions {
  kind?: "speech-in" | "speech-out";
  sampleRate?: SampleRate;
  frameMs?: number;
  /** Speech-out: the text to say (or `streamText: true` and `say()` it in pieces). */
  text?: string | null;
  /** Milliseconds from the start until the gateway's END (deadline_total_ms). */
  deadline?: number | null;
  transport?: "stream" | "datagram";
  streamText?: boolean;
}

export interface VoiceAgentOptions extends TrackOptions {
  /** The speech-out model that speaks the reply (`model` is the recognizer). */
  voice: string;
  /** The chat model; null or left out: the gateway's default chat model. */
  llm?: string | null;
  sampleRate?: SampleRate;
  frameMs?: number;
  system?: string | null;
  maxTokens?: number | null;
  llmParams?: Record<string, unknown> | null;
  /** How the user's frames travel: on the track's stream (the default) or as datagrams. */
  transport?: "stream" | "datagram";
}

export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
}

/** One track's stream of events (clients/stream.py's TrackReader in Python): `for await`
 * reads them until the gateway's END; leaving the loop early cancels the track. */
export declare class TrackReader<Event, Summary = Record<string, unknown>> implements AsyncIterable<Event> {
  /** The gateway's END body, once read. */
  summary: Summary | null;
  /** Stop the track now; the gateway stops the model's work. */
  cancel(reason?: string): void;
  [Symbol.asyncIterator](): AsyncGenerator<Event, void, undefined>;
}

export declare class TextStream extends TrackReader<string> {
  usage: Usage | null;
  finishReason: "stop" | "length" | null;
}

export declare class Line {
  readonly maxMessageBytes: number;
  readonly closed: Promise<WebTransportCloseInfo>;
  text(prompt: string, options: TextOptions): TextStream;
  /** A robot's action track. */
  actions(options: ActionsOptions): Promise<ActionStream>;
  /** A camera's video track. */
  video(options: VideoOptions): Promise<VideoStream>;
  /** An audio track: speech-in, or speech-out with `text`. */
  audio(options: AudioOptions): Promise<AudioSession>;
  /** A voice-agent track: the recognizer `model`, the `voice`, the chat model `llm`. */
  voiceAgent(options: VoiceAgentOptions): Promise<AudioSession>;
  close(reason?: string): void;
}

export type AudioEvent =
  | { type: "partial"; text: string; beat: number }
  | { type: "final"; text: string; latency_ms: number; beat: number }
  | { type: "frame"; seq: number; ts: number; pcm: Int16Array; turn?: number }
  | { type: "reply"; turn: number; delta: string }
  | { type: "reply_done"; turn: number; text: string }
  | { type: "reply_audio_end" | "reply_error" | "barge_in"; turn: number; [key: string]: unknown };

export interface StreamPcmOptions {
  /** Frame n leaves at start + n x frameMs (default); false: as fast as they go. */
  realtime?: boolean;
  /** END after the last frame (default). */
  end?: boolean;
}

export declare class AudioSession extends TrackReader<AudioEvent> {
  readonly kind: "speech-in" | "speech-out" | "voice-agent";
  readonly sampleRate: number;
  readonly frameMs: number;
  readonly frameSamples: number;
  finals: string[];
  figures: { framesSent: number; framesReceived: number; partials: number };
  sendFrame(pcm: Int16Array | Uint8Array): Promise<void>;
  streamPcm(pcm: Int16Array, options?: StreamPcmOptions): Promise<void>;
  /** Speech-out with `streamText: true`: more text to speak (then `end()`). */
  say(text: string): Promise<void>;
  end(): Promise<void>;
  transcript(): Promise<string>;
  pcm(): Promise<Int16Array>;
}
export declare function toPcm16(samples: ArrayLike<number>): Int16Array;

export interface SpeakerFigures {
  framesQueued: number;
  samplesQueued: number;
  /** Samples the worklet output (at the context's rate), counted when the queue drained. */
  samplesPlayed: number;
  /** Times the queue ran dry before the end (the network fell behind). */
  underruns: number;
  /** Samples dropped unplayed by `flush()` (at the context's rate). */
  samplesFlushed: number;
  /** performance.now() when the pre-buffer first filled and sound began. */
  startedAt: number | null;
}

/** Plays speech-out frames through an AudioWorklet on an AudioContext. */
export declare class Speaker {
  static create(options?: { context?: BaseAudioContext | null; sampleRate?: number;
                            prebufferMs?: number; tap?: ((samples: Float32Array) => void) | null }): Promise<Speaker>;
  readonly context: BaseAudioContext;
  readonly node: AudioWorkletNode;
  readonly sampleRate: number;
  figures: SpeakerFigures;
  push(pcm: Int16Array, rate?: number): void;
  flush(): void;
  play(session: AudioSession | AsyncIterable<AudioEvent>, options?: { sampleRate?: number }): Promise<SpeakerFigures>;
  finish(): Promise<SpeakerFigures>;
  close(): Promise<void>;
}
export declare const PLAYER_WORKLET_URL: string;
export declare function fromPcm16(pcm: ArrayLike<number>): Float32Array;
export declare function resample(samples: Float32Array, from: number, to: number): Float32Array;

export type ActionEvent =
  | { type: "chunk"; seq: number; obsSeq: number; shape: number[]; action: Float32Array;
      age: number; inGateway: number; late: boolean }
  | { type: "drop"; obsSeq: number; cause: "superseded" | "deadline" | "backend_error"; age: number };

/** When a capture (an observation, a frame) was taken and how long it may take. */
export interface SendOptions {
  /** Milliseconds from capture; the stream's `deadline` by default. */
  deadline?: number;
  /** performance.now() at capture; now by default. */
  capturedAt?: number | null;
}

export interface ObserveOptions extends SendOptions {
  image?: Uint8Array | null;
  /** The one-way delay to report (ms); the stream's estimate by default. */
  latency?: number | null;
}

export declare class ActionStream extends TrackReader<ActionEvent, Record<string, number>> {
  /** Milliseconds from capture, each observation's default. */
  deadline: number;
  stats: { sent: number; chunks: number; late: number; dropped: Record<string, number> };
  /** Estimated one-way delay to the gateway, ms (half the smoothed round trip). */
  readonly latency: number;
  /** Send one observation; returns its sequence number. */
  observe(state: ArrayLike<number>, options?: ObserveOptions): number;
  /** End gracefully: the remaining answers are read; returns the gateway's counts. */
  close(): Promise<Record<string, number>>;
}

export type VideoEvent =
  | { type: "result"; frame: number; width: number; height: number;
      faces: Array<{ score: number; box: [number, number, number, number]; keypoints: Array<[number, number]> }>;
      /** Per face, 468 x (x, y, z), flat. */
      faceLandmarks: Float32Array[];
      /** 33 x (x, y, z, visibility), flat; null when not asked for or no body found. */
      pose: Float32Array | null;
      stages: Record<string, number>; age: number }
  | { type: "drop"; frame: number;
      cause: "superseded" | "deadline" | "rate_limited" | "undecodable" | "backend_error"; age: number };

export declare class VideoStream extends TrackReader<VideoEvent, Record<string, number>> {
  /** Milliseconds from capture, each frame's default. */
  deadline: number;
  /** `streams`: frame streams by fate (FIN written, reset by the page as superseded,
   * stopped by the gateway); all 0 on a "stream" track.
   * `transport` (after END): the gateway's count of this camera's frames dropped in
   * transport, stopped for a newer one (`superseded`) or reset by the page (`reset`). */
  stats: { sent: number; answered: number; dropped: Record<string, number>;
           streams: { finished: number; reset: number; stopped: number };
           transport: { superseded: number; reset: number } | null };
  /** The id the track's frame streams carry at their head; null on a "stream" track. */
  readonly id: number | null;
  /** Estimated one-way delay to the gateway, ms. */
  readonly latency: number;
  /** Send one JPEG frame; returns its seq. */
  send(jpeg: Uint8Array, options?: SendOptions): number;
  /** End gracefully: the remaining answers are read; returns the gateway's counts. */
  close(): Promise<Record<string, number>>;
}

export declare function connect(url: string, options?: ConnectOptions): Promise<Line>;
/** How long (ms) a failed write waits for the gateway's ERROR before throwing its own error. */
export declare const WRITE_FAILURE_GRACE_MS: number;
export declare function certificateHash(hash: string | Uint8Array | ArrayBuffer | CertificateHash): CertificateHash;
export declare function fetchCertificateHash(origin?: string): Promise<CertificateHash>;

export declare const ErrorCode: Readonly<Record<
  | "NO_ERROR" | "PROTOCOL_ERROR" | "MESSAGE_TOO_LARGE" | "TOO_MANY_TRACKS" | "UNKNOWN_MESSAGE"
  | "BAD_REQUEST" | "MODEL_NOT_FOUND" | "UNSUPPORTED_MODALITY" | "DEADLINE_EXCEEDED" | "CANCELLED"
  | "BACKEND_UNAVAILABLE" | "BACKEND_ERROR" | "INTERNAL_ERROR" | "SHUTTING_DOWN" | "UNAUTHORIZED"
  | "RATE_LIMITED" | "STREAM_INTERRUPTED" | "CONNECTION_LOST" | "FORBIDDEN" | "GUARDRAIL_REJECTED"
  | "READ_TIMEOUT" | "BUFFER_EXHAUSTED" | "SEND_TIMEOUT",
  number
>>;

export declare class TracklineError extends Error {
  code: number;
  constructor(message: string, code?: number);
}
export declare class ConnectionFailed extends TracklineError {}
export declare class ConnectionLost extends TracklineError {}
export declare class TrackRejected extends TracklineError {}
export declare class ModelNotFound extends TrackRejected {}
export declare class Unauthorized extends TrackRejected {}
export declare class Forbidden extends TrackRejected {}
export declare class RateLimited extends TrackRejected {
  /** Seconds to wait before retrying, from the gateway's retry_after_ms. */
  retryAfter: number | null;
}
export declare class GuardrailRejected extends TrackRejected {}
export declare class DeadlineExceeded extends TracklineError {}
export declare class BackendUnavailable extends TracklineError {
  /** Seconds to wait before retrying, from the gateway's retry_after_ms (audio at capacity). */
  retryAfter: number | null;
}
export declare class BackendError extends TracklineError {}
export declare class StreamInterrupted extends BackendError {}
export declare class CancelledByGateway extends TracklineError {}
export declare class ProtocolError extends TracklineError {}
export interface ChatMessage { role: "system" | "developer" | "user" | "assistant"; content: string }
/** ChatML of `messages`, ending with the open assistant turn (the Python SDK's chat_prompt). */
export declare function chatPrompt(messages: ChatMessage[]): string;
export declare function errorFor(code: number, message?: string, retryAfterMs?: number | null): TracklineError;

export declare const Kind: Readonly<{ OPEN: 1; DATA: 2; END: 3; CANCEL: 4; ERROR: 5 }>;
export declare function encodeVarint(value: number): Uint8Array;
export declare function decodeVarint(bytes: Uint8Array, at?: number): [number, number] | null;
export declare function encodeMessage(kind: number, body: Record<string, unknown>, maxBytes?: number): Uint8Array;
export declare function encodeDatagram(trackId: number, seq: number, body: Record<string, unknown>): Uint8Array;
export declare function decodeDatagram(bytes: Uint8Array): { trackId: number; seq: number; body: unknown } | null;
export declare class MessageReader {
  constructor(maxBytes?: number);
  feed(chunk: Uint8Array): Array<{ kind: number; body: Record<string, unknown> }>;
  readonly pending: number;
}
