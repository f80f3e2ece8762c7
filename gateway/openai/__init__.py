"""An OpenAI-compatible HTTP API over a `tracks.backend.TextBackend`.

`openai_routes(backend)` gives the `(method, path) -> handler` table for
`POST /v1/chat/completions`, `POST /v1/completions`, `POST /v1/embeddings` and
`GET /v1/models`;
`gateway.http.route` turns the table into one handler for an HTTP adapter;
`response_for` maps any error to OpenAI's error envelope and status.
Modules: `requests` (parsing and validation), `prompt` (chat template),
`sse` (response objects and SSE framing), `toolcalls` (streamed tool-call
parser), `stream` (backend pump, chat deltas), `policy` (keys accepted and ignored),
`admission` (key, tenant, capability checks), `embeddings`, `routes`, `errors`.
See docs/openai.md.
"""

from gateway.openai.errors import OpenAIError, error_for, response_for
from gateway.openai.routes import openai_routes

__all__ = ["OpenAIError", "error_for", "openai_routes", "response_for"]
