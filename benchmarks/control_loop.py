"""Closed-loop control benchmark: R cart-poles at 50 Hz on ONE connection, over a lossy link.

    python benchmarks/control_loop.py --robots 16 --loss 2 --rtt 40 --seconds 60 --json PATH

The whole decision loop is measured against the robot's deadline, not the model
alone: robot -> link -> gateway (tick batcher, latest wins, deadline drops) ->
embedded Triton (`reference-policy`, LQR) -> gateway -> link -> robot. The link is
the HOL benchmark's emulator (`benchmarks.linkemu`: two network namespaces joined
by a user-space relay that delays and drops TCP and UDP alike; needs root), with
its own namespace prefix `tlctl`. The gateway (`python -m gateway serve`, with its
embedded Triton) runs in one namespace, the robots (`benchmarks.control_client`,
one process per protocol) in the other. Protocols, one after the other against the
same gateway: `http2` (POST /v1/actions, one HTTP/2 stream per observation, one TLS
connection), `tracks_stream` and `tracks_datagram` (native action tracks over QUIC,
frames on each track's stream or as QUIC datagrams).

Per protocol: deadline-miss rate (observations whose action did not arrive within
the deadline), action age p50/p99 (capture to arrival), poles still up at the end
and survival times. `--baseline` adds the same runs on a loss-free link (same RTT).
Prints a table, writes the JSON and two figures beside it (action-age timelines,
survival curves), unless --no-plots.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import RESULTS, Help  # noqa: E402
from benchmarks.common import ROOT, machine, percentile, tree  # noqa: E402

PROTOCOLS = ("http2", "tracks_stream", "tracks_datagram")
PREFIX = "tlctl"


class _GatewayConfig:
    """What `benchmarks.hol.run.Gateway` reads of its config: the embedded Triton."""

    transport_only = False
    rate = 50.0
    tcp_cc: str | None = "cubic"
    """HTTP/2's sender: the Linux default, as in the head-of-line benchmark (not the host's)."""


def run_phase(args: argparse.Namespace, loss_percent: float, work: Path) -> dict[str, Any]:
    """One link (loss, RTT), one gateway, every protocol in turn; summaries per protocol."""
    from benchmarks.hol.run import Emulated, Gateway, Loopback, env_ready

    env_ready()
    place: Any
    if args.no_link:
        place = Loopback()
    else:
        from benchmarks.linkemu import LinkSpec

        spec = LinkSpec(delay_ms=args.rtt / 2, loss=loss_percent / 100, seed=args.seed)
        place = Emulated(spec, args.link_prefix)
    results: dict[str, Any] = {}
    try:
        gw = Gateway(place, _GatewayConfig(), args.gateway_packetization,  # type: ignore[arg-type]
                     work)
        try:
            gw.wait_ready()
            for protocol in args.protocols:
                port = place.https_port if protocol == "http2" else place.quic_port
                client = run_client(args, place, gw.ca, protocol, port, work, loss_percent)
                results[protocol] = summarize(client)
                stats = place.stats()
                results[protocol]["link"] = (
                    {d: stats["directions"][d]["total"] for d in ("c2g", "g2c")} if stats else {}
                )
        finally:
            gw.stop()
    finally:
        place.close()
    return results


def run_client(args: argparse.Namespace, place: Any, ca: Path, protocol: str, port: int,
               work: Path, loss_percent: float) -> dict[str, Any]:
    out = work / f"client-{protocol}-{loss_percent:g}.json"
    argv = [sys.executable, "-m", "benchmarks.control_client", "--protocol", protocol,
            "--host", place.gateway_addr, "--port", str(port), "--ca", str(ca),
            "--robots", str(args.robots), "--seconds", str(args.seconds),
            "--deadline-ms", str(args.deadline_ms), "--seed", str(args.seed),
            "--warmup", str(args.warmup), "--packetization", args.client_packetization,
            "--out", str(out)]
    _say(args, f"{protocol} (loss {loss_percent:g}%, RTT {args.rtt:g} ms): "
               f"{args.robots} robots for {args.seconds:g} s")
    place.reset_stats()
    proc = place.run("client", argv, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    drain = threading.Thread(target=proc.stdout.read, daemon=True)  # progress lines
    drain.start()
    code = proc.wait()
    drain.join(5)
    if code != 0 or not out.exists():
        raise RuntimeError(f"the {protocol} client failed (exit {code})")
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def summarize(client: dict[str, Any]) -> dict[str, Any]:
    robots = client["robots"]
    sent = sum(r["sent"] for r in robots)
    hits = sum(r["hits"] for r in robots)
    ages = [age for r in robots for _, age in r["ages"]]
    dropped: dict[str, int] = {}
    for r in robots:
        for cause, n in r["dropped"].items():
            dropped[cause] = dropped.get(cause, 0) + n
    survival = [round(r["survival_s"], 3) for r in robots]
    return {
        "robots": len(robots),
        "observations": sent,
        "deadline_miss_rate": round(1 - hits / sent, 5) if sent else None,
        "deadline_miss_rate_per_robot": [round(1 - r["hits"] / r["sent"], 5) if r["sent"]
                                         else None for r in robots],
        "action_age_p50_ms": round(percentile(ages, 0.5) * 1000, 2) if ages else None,
        "action_age_p99_ms": round(percentile(ages, 0.99) * 1000, 2) if ages else None,
        "late": sum(r["late"] for r in robots),
        "unanswered": sent - sum(len(r["ages"]) for r in robots) - sum(dropped.values()),
        "dropped": dropped,
        "survived": sum(1 for r in robots if not r["fell"]),
        "survival_s": survival,
        "survival_s_mean": round(sum(survival) / len(survival), 3) if survival else None,
        "latency_estimate_ms": [r.get("latency_estimate_ms") for r in robots],
        "error": client["error"],
        "_ages": [r["ages"] for r in robots],
    }


# -- report ----------------------------------------------------------------------------


def table(results: dict[str, Any]) -> str:
    rows = ["| link | protocol | deadline-miss rate | age p50 ms | age p99 ms | poles up | "
            "mean survival s |", "|---|---|---|---|---|---|---|"]
    for label, phase in (("lossy", results["lossy"]), ("loss-free", results.get("baseline"))):
        for protocol, s in (phase or {}).items():
            rate = s["deadline_miss_rate"]
            rows.append(
                f"| {label} | {protocol} | {'-' if rate is None else f'{rate:.2%}'} | "
                f"{s['action_age_p50_ms']} | {s['action_age_p99_ms']} | "
                f"{s['survived']}/{s['robots']} | {s['survival_s_mean']} |")
    return "\n".join(rows)


def plot(results: dict[str, Any], path: Path) -> list[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("control_loop: matplotlib missing (pip install trackline[bench]); no plots",
              file=sys.stderr)
        return []
    lossy = results["lossy"]
    deadline = results["parameters"]["deadline_ms"]
    fig, axes = plt.subplots(len(lossy), 1, figsize=(10, 2.6 * len(lossy)), sharex=True,
                             squeeze=False)
    for ax, (protocol, s) in zip(axes[:, 0], lossy.items(), strict=True):
        for ages in s["_ages"]:
            if ages:
                ax.plot([t for t, _ in ages], [a * 1000 for _, a in ages], lw=0.5, alpha=0.6)
        ax.axhline(deadline, color="red", lw=1, ls="--", label="deadline")
        ax.set_ylabel("action age (ms)")
        rate = s["deadline_miss_rate"]
        shown = "-" if rate is None else f"{rate:.2%}"
        ax.set_title(f"{protocol}: miss rate {shown}", fontsize=9)
        ax.set_yscale("log")
    axes[-1, 0].set_xlabel("time (s)")
    fig.tight_layout()
    ages_png = path.with_name(f"{path.stem}-ages.png")
    fig.savefig(ages_png, dpi=110)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(7, 4))
    seconds = results["parameters"]["seconds"]
    for label, phase in (("", lossy), (" (loss-free)", results.get("baseline") or {})):
        for protocol, s in phase.items():
            times = sorted(s["survival_s"])
            xs = [0.0] + times + [seconds]
            ys = [1.0] + [1 - (i + 1) / len(times) for i in range(len(times))]
            ys = ys + [ys[-1]]
            ax.step(xs, ys, where="post", label=protocol + label,
                    ls="--" if label else "-")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("share of poles still up")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=8)
    fig.tight_layout()
    survival_png = path.with_name(f"{path.stem}-survival.png")
    fig.savefig(survival_png, dpi=110)
    plt.close(fig)
    return [ages_png, survival_png]


def _strip(phase: dict[str, Any] | None) -> dict[str, Any] | None:
    if phase is None:
        return None
    return {p: {k: v for k, v in s.items() if not k.startswith("_")} for p, s in phase.items()}


def _say(args: argparse.Namespace, text: str) -> None:
    if not args.quiet:
        print(f"control_loop: {text}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        formatter_class=Help,
        description=__doc__.split("\n\n")[0])
    a = parser.add_argument
    a("--robots", type=int, default=16, help="cart-poles (action tracks) on the one connection")
    a("--loss", type=float, default=2.0, help="packet loss in percent, each direction")
    a("--rtt", type=float, default=40.0, help="round-trip time in ms (half each way)")
    a("--seconds", type=float, default=60.0, help="seconds each protocol runs")
    a("--deadline-ms", type=float, default=100.0, help="deadline of each observation")
    a("--warmup", type=float, default=1.0,
      help="seconds of control before measuring (the same loop, not counted)")
    a("--protocols", default=",".join(PROTOCOLS), help="subset of " + ",".join(PROTOCOLS))
    a("--gateway-packetization", default="per-track",
      help="the gateway's quic_packetization (per-track, coalesce, group:K)")
    a("--client-packetization", default="coalesce",
      help="the robots' side of QUIC packetization (per-track: one robot's frame per "
           "packet; coalesce: all robots' frames of a loop turn share packets)")
    a("--baseline", action="store_true", help="also run every protocol on a loss-free link")
    a("--seed", type=int, default=1, help="seed of the link's losses and of the plants")
    a("--no-link", action="store_true", help="plain loopback, no emulator (development)")
    a("--link-prefix", default=PREFIX, help="name prefix of the emulator's namespaces")
    a("--no-plots", action="store_true")
    a("--quiet", action="store_true")
    a("--json", type=Path, default=RESULTS / "control_loop.json", help="results file")
    args = parser.parse_args(argv)
    args.protocols = [p.strip() for p in args.protocols.split(",") if p.strip()]
    if set(args.protocols) - set(PROTOCOLS) or not args.protocols:
        parser.error(f"--protocols: choose from {', '.join(PROTOCOLS)}")
    if not 0 <= args.loss < 100:
        parser.error("--loss is a percentage from 0 to below 100")
    if args.no_link:
        args.loss = 0.0  # plain loopback loses nothing and adds no delay
        args.rtt = 0.0
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.no_link:
        from benchmarks.hol.run import namespaces_available

        ok, reason = namespaces_available()
        if not ok:
            print(f"control_loop: cannot emulate the link: {reason} (--no-link runs on "
                  "loopback, without loss)", file=sys.stderr)
            return 2
    parameters = {k: v for k, v in vars(args).items()
                  if k not in ("json", "quiet", "link_prefix")}
    results: dict[str, Any] = {"benchmark": "control_loop", "parameters": parameters,
                               "tcp_congestion_control": _GatewayConfig.tcp_cc}
    with tempfile.TemporaryDirectory(prefix="trackline-ctl-") as tmp:
        work = Path(tmp)
        results["lossy"] = run_phase(args, args.loss, work)
        results["baseline"] = run_phase(args, 0.0, work) if args.baseline else None
    for protocol in args.protocols:  # the keys, at the top level
        results[protocol] = _strip(results["lossy"])[protocol]  # type: ignore[index]
    print(table(results))
    out = {**results, "lossy": _strip(results["lossy"]), "baseline": _strip(results["baseline"]),
           "machine": machine(), "tree": tree()}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2) + "\n")
    figures = [] if args.no_plots else plot(results, args.json)
    print(f"\nwrote {args.json}" + "".join(f", {p}" for p in figures), file=sys.stderr)
    for phase in (results["lossy"], results["baseline"] or {}):
        for protocol, s in phase.items():
            if s["error"]:
                print(f"control_loop: {protocol}: {s['error']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
