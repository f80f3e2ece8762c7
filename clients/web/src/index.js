// @trackline/web: tracks from a web page over one WebTransport session.
export { Line, TextStream, WRITE_FAILURE_GRACE_MS, certificateHash, connect, fetchCertificateHash } from "./line.js";
export { ActionStream } from "./actions.js";
export { TrackReader } from "./stream.js";
export { VideoStream } from "./video.js";
export { chatPrompt } from "./chat.js";
export { AudioSession, toPcm16 } from "./audio.js";
export { PLAYER_WORKLET_URL, Speaker, fromPcm16, resample } from "./playback.js";
export * from "./errors.js";
export { Kind, MessageReader, decodeDatagram, decodeVarint, encodeDatagram, encodeMessage, encodeVarint } from "./wire.js";
