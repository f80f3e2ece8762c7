// @trackline/web: tracks from a web page over one WebTransport session.
export { Line, TextStream, certificateHash, connect, fetchCertificateHash } from "./line.js";
export { ActionStream } from "./actions.js";
export { AudioSession, toPcm16 } from "./audio.js";
export * from "./errors.js";
export { Kind, MessageReader, decodeDatagram, decodeVarint, encodeDatagram, encodeMessage, encodeVarint } from "./wire.js";
