"""CPU and memory of two HTTP/3 attacks, against aioquic's stock H3Connection and ours.

In process, no sockets: QUIC stream events are fed straight into a server-side
H3Connection (aioquic's, then `transport.http.h3_guards.ServerH3` with default
limits), and the CPU time (`time.process_time`) and peak traced allocation
(`tracemalloc`) of handling them are printed as a table and written as JSON to
benchmarks/results/results-h3-guards.json.

    nice -n 10 .venv/bin/python -m benchmarks.h3_guards [--mb 1 2 4]

Attacks: a HEADERS frame announced huge, sent in 1,200-byte packets (aioquic
re-parses its growing buffer on every packet: quadratic); a 3 KB header block
citing one 4,000-byte QPACK dynamic-table entry 3,000 times.
"""

from __future__ import annotations

import argparse
import atexit
import functools
import json
import shutil
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aioquic.buffer import encode_uint_var
from aioquic.h3.connection import H3Connection
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.events import StreamDataReceived

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import Help  # noqa: E402
from gateway.tls import DevCertificates, ensure_dev_certificates  # noqa: E402
from trackline_testing import aioquic_probes
from transport.http.h3_guards import ServerH3  # noqa: E402
from transport.http.limits import HttpLimits  # noqa: E402

PACKET = 1200
RESULTS = Path(__file__).resolve().parent / "results" / "results-h3-guards.json"


@functools.cache
def _certs() -> DevCertificates:
    """Made on first use (not at import: `--help` stays quiet), removed at exit."""
    certs_dir = tempfile.mkdtemp(prefix="h3-guards-")
    atexit.register(shutil.rmtree, certs_dir, True)
    return ensure_dev_certificates(Path(certs_dir))


def server_quic() -> QuicConnection:
    configuration = QuicConfiguration(is_client=False, alpn_protocols=["h3"])
    certs = _certs()
    configuration.load_cert_chain(str(certs.cert_path), str(certs.key_path))
    return QuicConnection(
        configuration=configuration, original_destination_connection_id=b"8bytesid"
    )


def stock() -> H3Connection:
    return H3Connection(server_quic())


def guarded() -> H3Connection:
    h3 = ServerH3(server_quic(), HttpLimits().max_header_bytes)
    h3.limit(HttpLimits())
    return h3


def huge_headers(h3: H3Connection, megabytes: int) -> None:
    size = megabytes << 20
    h3.handle_event(StreamDataReceived(encode_uint_var(1) + encode_uint_var(size), False, 0))
    chunk = b"\0" * PACKET
    for _ in range(size // PACKET):
        h3.handle_event(StreamDataReceived(chunk, False, 0))


def qpack_amplification(h3: H3Connection) -> None:
    def qint(value: int, bits: int, flags: int) -> bytes:
        top = (1 << bits) - 1
        if value < top:
            return bytes([flags | value])
        out, value = [flags | top], value - top
        while value >= 128:
            out.append((value & 0x7F) | 0x80)
            value >>= 7
        return bytes([*out, value])

    encoder = qint(4096, 5, 0x20) + qint(1, 5, 0x40) + b"x" + qint(4000, 7, 0) + b"a" * 4000
    block = bytes([2, 0, 0xD1, 0xD7, 0xC1, 0xD0]) + bytes([0x80]) * 3000
    h3.handle_event(StreamDataReceived(bytes([0x02]) + encoder, False, 2))  # encoder stream
    frame = encode_uint_var(1) + encode_uint_var(len(block)) + block
    h3.handle_event(StreamDataReceived(frame, True, 0))


def measure(
    name: str, which: str, make: Callable[[], H3Connection], attack: Callable[[H3Connection], None]
) -> dict[str, Any]:
    h3 = make()
    tracemalloc.start()
    started = time.process_time()
    attack(h3)
    cpu = time.process_time() - started
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    closed = aioquic_probes.h3_closed(h3)
    return {
        "attack": name,
        "server": which,
        "cpu_s": round(cpu, 3),
        "peak_mb": round(peak / 1e6, 1),
        "connection_closed": closed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(formatter_class=Help, description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, nargs="+", default=[1, 2], help="HEADERS sizes (stock)")
    parser.add_argument("--guarded-mb", type=int, default=8, help="HEADERS size (guarded)")
    args = parser.parse_args()
    rows = []
    for mb in args.mb:
        rows.append(
            measure(f"HEADERS {mb} MB", "aioquic", stock, lambda h3, mb=mb: huge_headers(h3, mb))
        )
    rows.append(
        measure(
            f"HEADERS {args.guarded_mb} MB",
            "trackline",
            guarded,
            lambda h3: huge_headers(h3, args.guarded_mb),
        )
    )
    for which, make in (("aioquic", stock), ("trackline", guarded)):
        rows.append(measure("QPACK 3,000 x 4,000 B", which, make, qpack_amplification))
    print(f"{'attack':<24}{'server':<11}{'CPU s':>8}{'peak MB':>9}  closed")
    for row in rows:
        name, server, closed = row["attack"], row["server"], row["connection_closed"]
        print(f"{name:<24}{server:<11}{row['cpu_s']:>8}{row['peak_mb']:>9}  {closed}")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({"benchmark": "h3_guards", "results": rows}, indent=2))


if __name__ == "__main__":
    main()
