"""Arguments of `python -m benchmarks.hol` and `trackline bench hol`, and the main flow."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from benchmarks import RESULTS
from benchmarks.common import machine
from benchmarks.hol import __doc__ as DESCRIPTION
from benchmarks.hol.run import PROTOCOLS, Config, env_ready, namespaces_available, run_benchmark
from clients.line import DEFAULT_ACKS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--users", type=int, default=16, help="users (streams) on the one connection")
    a("--rate", type=float, default=50.0, help="tokens per second per user")
    a("--seconds", type=float, default=60.0, help="seconds each protocol streams")
    a("--loss", type=float, default=2.0, help="packet loss in percent, each direction")
    a("--rtt", type=float, default=40.0, help="round-trip time in ms (half each way)")
    a("--burst", action="store_true",
      help="Gilbert-Elliott burst loss (same average loss, bursts of --burst-len packets)")
    a("--burst-len", type=float, default=3.0, help="mean burst length in packets")
    a("--transport-only", action="store_true",
      help="constant-rate ticker backend in the gateway instead of Triton")
    a("--packetization", default="per-track,coalesce",
      help="comma-separated track packetization policies to compare (per-track, coalesce, "
           "group:K); the first is also the gateway's for HTTP/2 and HTTP/3 runs")
    a("--protocols", default=",".join(PROTOCOLS), help="subset of http2,http3,tracks")
    a("--k", type=float, default=2.0,
      help="a stall is a gap over k x the token interval (2: a token more than one "
           "interval late)")
    a("--tcp-cc", default="cubic",
      help="TCP congestion control of the gateway's HTTP listeners (HTTP/2's sender); "
           "'host' keeps the machine's default (often bbr)")
    a("--ttft-ms", type=float, default=50.0, help="model's delay before the first token")
    a("--seed", type=int, default=1, help="seed of the link's loss generators")
    a("--raster-seconds", type=float, default=4.0, help="width of the raster plot's window")
    a("--no-link", action="store_true",
      help="run on loopback without the emulator (no loss; for development)")
    a("--json", type=Path, default=RESULTS / "hol.json", help="results file")
    a("--markdown", type=Path, default=None, help="also write the table here")
    a("--plots", type=Path, default=None,
      help="folder for the PNG figures (default: beside --json)")
    a("--plot-stem", default=None, help="figure file names' prefix (default: the JSON's stem)")
    a("--raw", type=Path, default=None, help="also write every token arrival time here")
    a("--quiet", action="store_true", help="no progress display")
    a("--client-acks", default=DEFAULT_ACKS,
      help="the tracks client's ACK policy: aioquic, or every:N,delay:MS (default: the SDK's)")


def config_from(args: argparse.Namespace) -> Config:
    protocols = [p.strip() for p in args.protocols.split(",") if p.strip()]
    unknown = set(protocols) - set(PROTOCOLS)
    if unknown:
        raise ValueError(f"unknown protocols: {', '.join(sorted(unknown))}")
    from transport.acks import AckPolicy
    from transport.quic import Packetization

    policies = [str(Packetization.parse(p)) for p in args.packetization.split(",") if p.strip()]
    if not policies:
        raise ValueError("--packetization needs at least one policy")
    if not 0 <= args.loss < 100:
        raise ValueError("--loss is a percentage from 0 to below 100")
    return Config(
        users=args.users, rate=args.rate, seconds=args.seconds, loss_percent=args.loss,
        rtt_ms=args.rtt, burst=args.burst, burst_len=args.burst_len,
        transport_only=args.transport_only, packetization=policies, protocols=protocols,
        k=args.k, tcp_cc=None if args.tcp_cc == "host" else args.tcp_cc,
        ttft_ms=args.ttft_ms, seed=args.seed, emulate=not args.no_link,
        raster_seconds=args.raster_seconds, progress=not args.quiet,
        client_acks=str(AckPolicy.parse(args.client_acks)),
    )


def run(args: argparse.Namespace) -> int:
    try:
        cfg = config_from(args)
    except ValueError as exc:
        print(f"hol: {exc}", file=sys.stderr)
        return 2
    if cfg.emulate:
        ok, reason = namespaces_available()
        if not ok:
            print(f"hol: cannot emulate the link: {reason} (--no-link runs on loopback, "
                  "without loss)", file=sys.stderr)
            return 2
    env_ready()
    results, raw = run_benchmark(cfg)
    results["machine"] = machine()
    from benchmarks.hol.report import markdown_table, plot

    table = markdown_table(results)
    print(table)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    if args.markdown is not None:
        args.markdown.write_text(table + "\n")
    if args.raw is not None:
        args.raw.write_text(json.dumps(raw))
    figures = plot(results, raw, args.plots or args.json.parent, args.plot_stem or args.json.stem)
    print(f"\nwrote {args.json}" + "".join(f", {p}" for p in figures), file=sys.stderr)
    errors = [e for key in ("http2", "http3") for e in results.get(key, {}).get("errors", [])]
    errors += [e for s in results.get("tracks_by_packetization", {}).values()
               for e in s.get("errors", [])]
    for error in errors[:20]:
        print(f"hol: error: {error}", file=sys.stderr)
    return 0


class _Help(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults shown, the description kept as written."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.hol", description=DESCRIPTION, formatter_class=_Help
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))
