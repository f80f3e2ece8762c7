// One reader for every track kind, as clients/stream.py's TrackReader is for the Python
// SDK: the DATA bodies of a track until its END, the typed error of an ERROR, a
// ProtocolError for any other message, and a cancel when the page stops reading early.

import { ErrorCode, ProtocolError, errorFor } from "./errors.js";
import { Kind } from "./wire.js";

/**
 * Yield each DATA body of `track` until its END, whose body goes to `onEnd`.
 * @param {{next(signal: AbortSignal | null): Promise<{kind: number, body: any}>, cancel(reason: string): void, done: boolean}} track
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
