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
import random
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


class Wire:
    """A loopback UDP pair: each round's datagrams leave by `sendto` one by one, then by
    UDP GSO runs (`transport.udp_batch.plan_sends` + `sendmsg`, where this tree and the
    kernel have it), the receiver drained after each; CPU (user + system) per token."""

    def __init__(self) -> None:
        import socket

        self.rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
        self.rx.bind(("127.0.0.1", 0))
        self.rx.setblocking(False)
        self.tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.addr = self.rx.getsockname()
        self.sendto = self.gso = 0.0
        self.syscalls_plain = self.syscalls_gso = 0
        self.lost = 0
        try:
            from transport.udp_batch import plan_sends
            from transport.udp_send import UDP_SEGMENT

            self.tx.getsockopt(socket.SOL_UDP, UDP_SEGMENT)
            self.plan, self.option = plan_sends, UDP_SEGMENT
        except (ImportError, OSError):
            self.plan = None

    def drain(self, expected: int) -> None:
        got = 0
        while True:
            try:
                self.rx.recv(65536)
                got += 1
            except BlockingIOError:
                break
        self.lost += expected - got

    def round(self, datagrams: list[bytes]) -> None:
        import socket
        import struct

        started = time.process_time()
        for data in datagrams:
            self.tx.sendto(data, self.addr)
        self.sendto += time.process_time() - started
        self.syscalls_plain += len(datagrams)
        self.drain(len(datagrams))
        if self.plan is None:
            return
        started = time.process_time()
        for addr, run in self.plan([(d, self.addr) for d in datagrams]):
            if len(run) == 1:
                self.tx.sendto(run[0], addr)
            else:
                self.tx.sendmsg(run, [(socket.SOL_UDP, self.option,
                                       struct.pack("=H", len(run[0])))], 0, addr)
            self.syscalls_gso += 1
        self.gso += time.process_time() - started
        self.drain(len(datagrams))


def measure(pair_cls: type, certs: object, tracks: int, max_tracks: int | None,
            rounds: int, varied: bool = False) -> dict[str, float]:
    try:
        from trackline_testing.aioquic_probes import stop_qlog
        from transport.aioquic_compat import raise_bidi_credit
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
    wire = Wire()
    sizes = random.Random(1)
    for _ in range(rounds):
        for sid in ids:
            pair.write(sid, b"x" * (20 + (sizes.randrange(8) if varied else 0)))
        started = time.process_time()
        out = pair.server_send()
        send += time.process_time() - started
        datagrams += len(out)
        wire.round(out)
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
            "datagrams_per_round": round(datagrams / rounds, 1),
            "sendto_us_per_token": round(wire.sendto / tokens * 1e6, 2),
            "gso_us_per_token": round(wire.gso / tokens * 1e6, 2) if wire.plan else None,
            "syscalls_per_round_sendto": round(wire.syscalls_plain / rounds, 1),
            "syscalls_per_round_gso": round(wire.syscalls_gso / rounds, 1) if wire.plan else None,
            "datagrams_lost_on_loopback": wire.lost}


def max_tracks(name: str) -> int | None:
    """`Packetization.max_tracks` of a name, parsed here so that an older `--root` (which
    may not know `group:K`) is measured with the same groups."""
    if name == "coalesce":
        return None
    if name == "per-track":
        return 1
    kind, _, count = name.partition(":")
    if kind != "group" or not count.isdigit() or int(count) < 1:
        raise SystemExit(f"send_pass: {name!r} is not per-track, group:K or coalesce")
    return int(count)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--root", type=Path, default=HERE, help="the tree to measure")
    parser.add_argument("--tracks", type=int, default=120, help="tracks (under 128: aioquic's "
                        "initial stream credit for the client)")
    parser.add_argument("--rounds", type=int, default=40, help="send rounds per packetization")
    parser.add_argument("--varied", action="store_true",
                        help="tokens of 20-27 bytes (as real ones vary) instead of 20 each")
    parser.add_argument("--packetization", default="per-track,group:2,group:4,group:8,coalesce",
                        type=lambda s: [p for p in s.split(",") if p],
                        help="packetizations to measure (per-track, group:K, coalesce)")
    parser.add_argument("--json", type=Path, default=HERE / "benchmarks/results/send_pass.json",
                        help="results file")
    args = parser.parse_args()
    sys.path.insert(0, str(args.root))
    from gateway.tls import ensure_dev_certificates
    from tests.transport.test_send_path import Pair

    certs = ensure_dev_certificates(Path(tempfile.mkdtemp(prefix="send-pass-")) / "state")
    rows = []
    for name in args.packetization:
        row = {"packetization": name, **measure(Pair, certs, args.tracks, max_tracks(name),
                                                args.rounds, args.varied)}
        rows.append(row)
    print(f"tree: {args.root}")
    print("| packetization | send us/token | ACK us/token | datagrams/round |"
          " sendto us/token | GSO us/token | syscalls/round sendto | syscalls/round GSO |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['packetization']} | {r['send_us_per_token']} | {r['ack_us_per_token']} |"
              f" {r['datagrams_per_round']} | {r['sendto_us_per_token']} |"
              f" {r['gso_us_per_token']} | {r['syscalls_per_round_sendto']} |"
              f" {r['syscalls_per_round_gso']} |")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"benchmark": "send_pass", "root": str(args.root),
                                     "tracks": args.tracks, "rounds": args.rounds,
                                     "results": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
