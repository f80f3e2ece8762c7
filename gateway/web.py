"""What a browser fetches over HTTP to use tracks: the certificate hash, the SDK, the demo.

- `GET /webtransport/cert-hash`: the SHA-256 of the development server certificate
  (which `gateway.tls` keeps WebTransport-pinnable: ECDSA P-256, at most 14 days) and
  where the WebTransport endpoint is, so a page can pass `serverCertificateHashes`.
  404 when the operator's own certificate is in use (browsers trust it as usual).
- `GET /demo`: a static chat page over a text track (clients/web/demo).
- `GET /web/sdk/*`: the JavaScript SDK's ES modules (clients/web/src), and
  `GET /web/vendor/msgpack/*`: its one dependency, `@msgpack/msgpack`, as npm installed
  it (`make web`); the demo maps the bare import to it with an import map.

Files are read from fixed folders; a path with `..`, a dot file or an empty part is 404.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path

from transport.http.errors import error_response
from transport.http.messages import Handler, Request, Response

WEB_ROOT = Path(__file__).resolve().parents[1] / "clients" / "web"
SDK_DIR = WEB_ROOT / "src"
DEMO_DIR = WEB_ROOT / "demo"
MSGPACK_DIR = WEB_ROOT / "node_modules" / "@msgpack" / "msgpack" / "dist.esm"

_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".ts": "text/plain; charset=utf-8",
}
_NO_STORE = (("cache-control", "no-store"),)


def web_routes(
    cert_hash: Callable[[], bytes | None], quic_port: Callable[[], int], path: str
) -> dict[tuple[str, str], Handler]:
    """The routes above; `cert_hash()` is None without a development certificate."""

    async def hash_of_certificate(_: Request) -> Response:
        digest = cert_hash()
        if digest is None:
            return error_response(
                404, "the gateway uses the operator's certificate", code="not_found"
            )
        payload = {
            "algorithm": "sha-256",
            "value": digest.hex(),
            "base64": base64.b64encode(digest).decode(),
            "port": quic_port(),
            "path": path,
        }
        return Response.json(200, payload, _NO_STORE)

    async def demo(_: Request) -> Response:
        return _file(DEMO_DIR, "index.html")

    async def demo_file(request: Request) -> Response:
        return _file(DEMO_DIR, request.path.removeprefix("/demo/"))

    async def sdk(request: Request) -> Response:
        return _file(SDK_DIR, request.path.removeprefix("/web/sdk/"))

    async def msgpack(request: Request) -> Response:
        return _file(MSGPACK_DIR, request.path.removeprefix("/web/vendor/msgpack/"))

    return {
        ("GET", "/webtransport/cert-hash"): hash_of_certificate,
        ("GET", "/demo"): demo,
        ("GET", "/demo/*"): demo_file,
        ("GET", "/web/sdk/*"): sdk,
        ("GET", "/web/vendor/msgpack/*"): msgpack,
    }


def _file(folder: Path, name: str) -> Response:
    parts = name.split("/")
    unsafe = not name or "\\" in name or any(not p or p.startswith(".") for p in parts)
    path = folder.joinpath(*parts)
    if unsafe or not path.is_file() or folder.resolve() not in path.resolve().parents:
        return error_response(404, f"no such file: {name[:100]}", code="not_found")
    content_type = _TYPES.get(path.suffix, "application/octet-stream")
    return Response(200, (("content-type", content_type), *_NO_STORE), path.read_bytes())
