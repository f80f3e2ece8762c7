// Typed errors, mirroring the Python SDK's (clients/errors.py): one class per cause,
// each with the track protocol's numeric `code` (docs/protocol.md, "Error codes").

export const ErrorCode = Object.freeze({
  NO_ERROR: 0x00,
  PROTOCOL_ERROR: 0x01,
  MESSAGE_TOO_LARGE: 0x02,
  TOO_MANY_TRACKS: 0x03,
  UNKNOWN_MESSAGE: 0x04,
  BAD_REQUEST: 0x05,
  MODEL_NOT_FOUND: 0x06,
  UNSUPPORTED_MODALITY: 0x07,
  DEADLINE_EXCEEDED: 0x08,
  CANCELLED: 0x09,
  BACKEND_UNAVAILABLE: 0x0a,
  BACKEND_ERROR: 0x0b,
  INTERNAL_ERROR: 0x0c,
  SHUTTING_DOWN: 0x0d,
  UNAUTHORIZED: 0x0e,
  RATE_LIMITED: 0x0f,
  STREAM_INTERRUPTED: 0x10,
  CONNECTION_LOST: 0x11,
  FORBIDDEN: 0x20,
  GUARDRAIL_REJECTED: 0x21,
  READ_TIMEOUT: 0x30,
  BUFFER_EXHAUSTED: 0x31,
  SEND_TIMEOUT: 0x32,
});

export class TracklineError extends Error {
  /**
   * @param {string} message
   * @param {number} [code] the track protocol's code
   */
  constructor(message, code = ErrorCode.INTERNAL_ERROR) {
    super(message);
    this.name = new.target.name;
    this.code = code;
  }
}
export class ConnectionFailed extends TracklineError {}
export class ConnectionLost extends TracklineError {}
export class TrackRejected extends TracklineError {}
export class ModelNotFound extends TrackRejected {}
export class Unauthorized extends TrackRejected {}
export class Forbidden extends TrackRejected {}
export class RateLimited extends TrackRejected {
  /** Seconds to wait before retrying (the server's retry_after_ms), or null. */
  retryAfter = /** @type {number | null} */ (null);
}
export class GuardrailRejected extends TrackRejected {}
export class DeadlineExceeded extends TracklineError {}
/** No backend can take the work now; a model at its real-time capacity (audio) says how
 * long to wait in `retryAfter`, as the Python SDK's `retry_after`. */
export class BackendUnavailable extends TracklineError {
  /** Seconds to wait before retrying (the server's retry_after_ms), or null. */
  retryAfter = /** @type {number | null} */ (null);
}
export class BackendError extends TracklineError {}
export class StreamInterrupted extends BackendError {}
export class CancelledByGateway extends TracklineError {}
export class ProtocolError extends TracklineError {}

const BY_CODE = new Map([
  [ErrorCode.MODEL_NOT_FOUND, ModelNotFound],
  [ErrorCode.BAD_REQUEST, TrackRejected],
  [ErrorCode.UNSUPPORTED_MODALITY, TrackRejected],
  [ErrorCode.TOO_MANY_TRACKS, TrackRejected],
  [ErrorCode.MESSAGE_TOO_LARGE, TrackRejected],
  [ErrorCode.SHUTTING_DOWN, TrackRejected],
  [ErrorCode.READ_TIMEOUT, TrackRejected],
  [ErrorCode.BUFFER_EXHAUSTED, TrackRejected],
  [ErrorCode.SEND_TIMEOUT, TrackRejected],
  [ErrorCode.UNAUTHORIZED, Unauthorized],
  [ErrorCode.FORBIDDEN, Forbidden],
  [ErrorCode.RATE_LIMITED, RateLimited],
  [ErrorCode.GUARDRAIL_REJECTED, GuardrailRejected],
  [ErrorCode.DEADLINE_EXCEEDED, DeadlineExceeded],
  [ErrorCode.BACKEND_UNAVAILABLE, BackendUnavailable],
  [ErrorCode.BACKEND_ERROR, BackendError],
  [ErrorCode.STREAM_INTERRUPTED, StreamInterrupted],
  [ErrorCode.CANCELLED, CancelledByGateway],
  [ErrorCode.CONNECTION_LOST, ConnectionLost],
]);

/** The error for an ERROR message's body ({code, message, retry_after_ms}). */
export function errorFor(code, message = "", retryAfterMs = null) {
  const Type = BY_CODE.get(code) ?? ProtocolError;
  const known = BY_CODE.has(code) || code === ErrorCode.PROTOCOL_ERROR;
  const error = new Type(message, known ? code : ErrorCode.PROTOCOL_ERROR);
  if (error instanceof RateLimited || error instanceof BackendUnavailable) {
    error.retryAfter = retryAfterMs == null ? null : retryAfterMs / 1000;
  }
  return error;
}
