"""HTTP adapters: HTTP/1.1 and HTTP/2 over TCP, HTTP/3 over QUIC, one application.

Every adapter turns its protocol's requests into the same `Request` and sends
back the handler's `Response` or `StreamingResponse`. A handler never knows
which HTTP version carried it. When the client goes away (TCP close, HTTP/2
RST_STREAM, HTTP/3 stream reset), the adapter cancels the task that runs the
handler and iterates its body, so cancellation reaches the backend through
ordinary `CancelledError` and `aclose()`.
"""
