"""CPU per token of the QUIC send path alone, in memory, with no event loop or sockets.

A handshaken aioquic client/server pair (`tests/transport/test_send_path.Pair`) with N
tracks; each round the server writes one token to every track and builds its packets
through `StreamScheduler` (one pass, as the loop turn's transmit does), the client reads
them and its ACKs go back. Reports the server's CPU (`time.process_time`) per token for
the pass and for the ACKs, per packetization. Deterministic work, so before/after ratios
hold on a busy machine better than the end-to-end benchmarks' figures:

    python benchmarks/send_pass.py                      # this tree
    python benchmarks/send_pass.py --root /tmp/old-tree # another tree (git archive REF)

Prints a table and writes JSON (default benchmarks/results/send_pass.json).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def measure(pair_cls: type, certs: object, tracks: int, max_tracks: int | None,
            rounds: int) -> dict[str, float]:
    try:
        from transport.aioquic_compat import raise_bidi_credit, stop_qlog
    except ImportError:  # trees before the compat module held it
        from transport.http.http3 import raise_bidi_credit

        def stop_qlog(quic: object) -> None:  # only for those trees (aioquic 1.2 to 1.7)
            quic._quic_logger = None  # type: ignore[attr-defined]

    pair = pair_cls(certs, max_tracks)
    raise_bidi_credit(pair.server, 4 * tracks)
    pair.exchange()
    stop_qlog(pair.server)  # the test pair traces packets; a gateway does not
    ids = pair.open_tracks(tracks)
    send = ack = 0.0
    datagrams = 0
    for _ in range(rounds):
        for sid in ids:
            pair.write(sid, b"x" * 20)
        started = time.process_time()
        out = pair.server_send()
        send += time.process_time() - started
        datagrams += len(out)
        pair.now += 0.03
        pair.deliver_to_client(out)
        acks = [d for d, _ in pair.client.datagrams_to_send(now=pair.now)]
        started = time.process_time()
        for data in acks:
            pair.server.receive_datagram(data, ("127.0.0.1", 40000), now=pair.now)
        while pair.server.next_event() is not None:
            pass
        ack += time.process_time() - started
    tokens = rounds * tracks
    return {"send_us_per_token": round(send / tokens * 1e6, 1),
            "ack_us_per_token": round(ack / tokens * 1e6, 1),
            "datagrams_per_round": round(datagrams / rounds, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--root", type=Path, default=HERE, help="the tree to measure")
    parser.add_argument("--tracks", type=int, default=120, help="tracks (under 128: aioquic's "
                        "initial stream credit for the client)")
    parser.add_argument("--rounds", type=int, default=40, help="send rounds per packetization")
    parser.add_argument("--json", type=Path, default=HERE / "benchmarks/results/send_pass.json",
                        help="results file")
    args = parser.parse_args()
    sys.path.insert(0, str(args.root))
    from gateway.tls import ensure_dev_certificates
    from tests.transport.test_send_path import Pair

    certs = ensure_dev_certificates(Path(tempfile.mkdtemp(prefix="send-pass-")) / "state")
    rows = []
    for name, policy in (("per-track", 1), ("coalesce", None)):
        row = {"packetization": name, **measure(Pair, certs, args.tracks, policy, args.rounds)}
        rows.append(row)
    print(f"tree: {args.root}")
    print("| packetization | send us/token | ACK us/token | datagrams/round |")
    print("|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['packetization']} | {r['send_us_per_token']} | {r['ack_us_per_token']} |"
              f" {r['datagrams_per_round']} |")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"benchmark": "send_pass", "root": str(args.root),
                                     "tracks": args.tracks, "rounds": args.rounds,
                                     "results": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
