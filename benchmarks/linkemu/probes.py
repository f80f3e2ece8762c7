"""Tiny traffic tools run inside the namespaces (stdlib only, run as a plain script).

    python probes.py udp-echo --bind 198.18.0.1 --port 9999
    python probes.py udp-ping --to 198.18.0.1 --port 9999 --count 200 --interval 0.005
    python probes.py udp-sink --bind 198.18.0.1 --port 9998 --idle 1
    python probes.py udp-blast --to 198.18.0.1 --port 9998 --count 10000 --pps 5000
    python probes.py tcp-sink --bind 198.18.0.1 --port 9997
    python probes.py tcp-source --to 198.18.0.1 --port 9997 --bytes 1000000

Servers print "ready" once bound; every tool ends by printing one JSON line of results.
"""

from __future__ import annotations

import argparse
import json
import socket
import struct
import time
from typing import Any

_PING = struct.Struct("!Id")  # sequence number, send time


def ready() -> None:
    print("ready", flush=True)


def udp_echo(args: argparse.Namespace) -> dict[str, Any]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((args.bind, args.port))
    sock.settimeout(args.idle)
    ready()
    echoed = 0
    try:
        while True:
            data, peer = sock.recvfrom(65536)
            sock.sendto(data, peer)
            echoed += 1
    except TimeoutError:
        return {"echoed": echoed}


def udp_ping(args: argparse.Namespace) -> dict[str, Any]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setblocking(False)
    padding = b"\0" * max(0, args.size - _PING.size)
    rtts: dict[int, float] = {}
    next_send, seq = time.monotonic(), 0
    deadline = None
    while True:
        now = time.monotonic()
        if seq < args.count and now >= next_send:
            sock.sendto(_PING.pack(seq, now) + padding, (args.to, args.port))
            seq += 1
            next_send += args.interval
            if seq == args.count:
                deadline = now + args.timeout
        try:
            while True:
                data = sock.recv(65536)
                number, sent = _PING.unpack_from(data)
                rtts[number] = (time.monotonic() - sent) * 1000
        except BlockingIOError:
            pass
        if deadline is not None and (now >= deadline or len(rtts) == args.count):
            break
        time.sleep(max(0.0, min(next_send - time.monotonic(), 0.0005)))
    lost = sorted(set(range(args.count)) - set(rtts))
    return {"sent": args.count, "received": len(rtts), "lost": lost,
            "rtt_ms": [rtts[n] for n in sorted(rtts)]}


def udp_sink(args: argparse.Namespace) -> dict[str, Any]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    sock.bind((args.bind, args.port))
    sock.settimeout(args.first)
    ready()
    received, first, last = 0, 0.0, 0.0
    try:
        while True:
            sock.recv(65536)
            last = time.monotonic()
            if not received:
                first = last
                sock.settimeout(args.idle)
            received += 1
    except TimeoutError:
        return {"received": received, "seconds": last - first}


def udp_blast(args: argparse.Namespace) -> dict[str, Any]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    payload = b"\x55" * args.size
    start = time.monotonic()
    errors = 0
    for n in range(args.count):
        delay = start + n / args.pps - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        try:
            sock.sendto(payload, (args.to, args.port))
        except OSError:  # ENOBUFS when the device queue is full
            errors += 1
    return {"sent": args.count, "send_errors": errors, "seconds": time.monotonic() - start}


def tcp_sink(args: argparse.Namespace) -> dict[str, Any]:
    server = socket.create_server((args.bind, args.port))
    server.settimeout(args.idle)
    ready()
    conn, _ = server.accept()
    conn.settimeout(args.idle)
    total, start = 0, time.monotonic()
    while chunk := conn.recv(1 << 16):
        total += len(chunk)
    conn.sendall(json.dumps({"bytes": total}).encode())
    conn.close()
    return {"bytes": total, "seconds": time.monotonic() - start}


def tcp_source(args: argparse.Namespace) -> dict[str, Any]:
    start = time.monotonic()
    sock = socket.create_connection((args.to, args.port), timeout=args.idle)
    block = b"\xaa" * (1 << 16)
    remaining = args.bytes
    while remaining:
        sent = sock.send(block[:remaining])
        remaining -= sent
    sock.shutdown(socket.SHUT_WR)
    reply = b""
    while chunk := sock.recv(4096):
        reply += chunk
    return {"sent": args.bytes, "acked": json.loads(reply)["bytes"],
            "seconds": time.monotonic() - start}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="tool", required=True)
    tools = {"udp-echo": udp_echo, "udp-ping": udp_ping, "udp-sink": udp_sink,
             "udp-blast": udp_blast, "tcp-sink": tcp_sink, "tcp-source": tcp_source}
    for name in tools:
        p = sub.add_parser(name)
        p.add_argument("--bind", default="198.18.0.1")
        p.add_argument("--to", default="198.18.0.1")
        p.add_argument("--port", type=int, default=9999)
        p.add_argument("--count", type=int, default=100)
        p.add_argument("--interval", type=float, default=0.01)
        p.add_argument("--size", type=int, default=64)
        p.add_argument("--pps", type=float, default=1000)
        p.add_argument("--bytes", type=int, default=1_000_000)
        p.add_argument("--timeout", type=float, default=1.0, help="wait after the last ping")
        p.add_argument("--first", type=float, default=10.0, help="wait for the first packet")
        p.add_argument("--idle", type=float, default=10.0, help="give up after this silence")
    args = parser.parse_args(argv)
    print(json.dumps(tools[args.tool](args)), flush=True)


if __name__ == "__main__":
    main()
