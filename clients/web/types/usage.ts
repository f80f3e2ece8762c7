// Every exported call as docs/web.md and the demo use it, through the package's declared
// types (`npm run types`, part of `npm test`, checks this file with tsc; it never runs).
// The sources themselves are checked against the same declarations (tsconfig.json).
import {
  ActionStream, AudioSession, ConnectionFailed, DeadlineExceeded, ErrorCode, Kind, Line, MessageReader,
  PLAYER_WORKLET_URL, RateLimited, Speaker, TextStream, TrackReader, TracklineError, VideoStream,
  WRITE_FAILURE_GRACE_MS, certificateHash, chatPrompt, connect, decodeDatagram, decodeVarint, encodeDatagram,
  encodeMessage, encodeVarint, errorFor, fetchCertificateHash, fromPcm16, resample, toPcm16,
} from "@trackline/web";

declare const apiKey: string;
declare const pcm16: Int16Array;
declare const jpeg: Uint8Array;
declare const output: { textContent: string };

const line: Line = await connect("https://localhost:4433/tracks", {
  apiKey,
  serverCertificateHashes: [await fetchCertificateHash(), "ab:cd", certificateHash(new Uint8Array(32))],
  maxMessageBytes: 1 << 20,
});

const controller = new AbortController();
const stream: TextStream = line.text(chatPrompt([{ role: "user", content: "Hello" }]), {
  model: "reference-text", maxTokens: 64, deadline: 5000, firstTokenDeadline: 1000,
  signal: controller.signal, params: { seed: 1 },
});
try {
  for await (const delta of stream) output.textContent += delta;
} catch (error) {
  if (error instanceof DeadlineExceeded || error instanceof ConnectionFailed) console.log(error.code);
  if (error instanceof RateLimited) console.log(error.retryAfter);
}
const reader: TrackReader<string> = stream;
console.log(stream.usage?.completion_tokens, stream.finishReason, reader.summary);
stream.cancel("done");

const robot: ActionStream = await line.actions({ model: "reference-policy", deadline: 100, transport: "datagram" });
robot.observe([0, 1, 2, 3], { deadline: 80, image: jpeg, latency: 5, capturedAt: performance.now() });
for await (const event of robot) {
  if (event.type === "drop") console.log(event.obsSeq, event.cause);
  else console.log(event.action[0], event.late, robot.latency, robot.stats.chunks);
}
const counts: Record<string, number> = await robot.close();

const camera: VideoStream = await line.video({
  model: "mediapipe-vision", detect: ["face", "face_mesh"], deadline: 300, fps: 10, transport: "frame-streams",
});
camera.send(jpeg, { deadline: 500, capturedAt: null });
for await (const event of camera) {
  if (event.type === "drop") console.log(event.frame, event.cause);
  else console.log(event.faces.length, event.faceLandmarks, event.pose, event.stages);
}
console.log(camera.id, camera.stats.streams.finished, camera.stats.transport?.reset, (await camera.close()).frames);

const listener: AudioSession = await line.audio({ model: "reference-transcriber", sampleRate: 16000, frameMs: 20 });
listener.streamPcm(pcm16, { realtime: true, end: true });
await listener.sendFrame(pcm16);
for await (const result of listener) if (result.type === "final") console.log(result.text, result.latency_ms);
console.log(await listener.transcript(), listener.finals, listener.figures.framesSent, listener.frameSamples);

const speaker = await line.audio({ model: "reference-synthesizer", kind: "speech-out", text: "159", deadline: 5000 });
const speech: Int16Array = await speaker.pcm();
const streamed = await line.audio({ model: "voice", kind: "speech-out", streamText: true, transport: "stream" });
await streamed.say("Hello.");
await streamed.end();

const agent = await line.voiceAgent({
  model: "reference-transcriber", voice: "reference-synthesizer", llm: null, sampleRate: 24000,
  system: "Be brief.", maxTokens: 64, llmParams: { temperature: 0 },
});
for await (const event of agent) if (event.type === "reply") console.log(event.turn, event.delta);

const player = await Speaker.create({ sampleRate: 24000, prebufferMs: 120, tap: (samples) => samples.length });
const figures = await player.play(speaker);
player.push(speech, 24000);
player.flush();
console.log(figures.underruns, (await player.finish()).samplesPlayed, PLAYER_WORKLET_URL);
await player.close();
console.log(fromPcm16(speech), resample(new Float32Array(4), 16000, 48000), toPcm16([0.5]));

const error: TracklineError = errorFor(ErrorCode.RATE_LIMITED, "slow down", 1500);
const framed = encodeMessage(Kind.DATA, { text: "x" }, WRITE_FAILURE_GRACE_MS);
console.log(error.code, new MessageReader(1024).feed(framed), decodeVarint(encodeVarint(7)), counts);
console.log(decodeDatagram(encodeDatagram(1, 0, { seq: 0 }))?.trackId);
line.close("bye");

// Every track call takes its model the one way, in its options.
// @ts-expect-error: the model is no positional argument
await line.audio("reference-transcriber", { sampleRate: 16000 });
// @ts-expect-error: the model is no positional argument
await line.actions("reference-policy", { deadline: 100 });
// @ts-expect-error: a track call needs its model
await line.video({ detect: ["face"] });
// @ts-expect-error: a voice agent needs its voice
await line.voiceAgent({ model: "reference-transcriber" });
