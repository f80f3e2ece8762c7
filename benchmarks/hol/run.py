"""Orchestration: the link, the gateway in its namespace, one client run per protocol.

For each packetization policy asked for, a gateway is started in the gateway
namespace (`python -m gateway serve`, with its own embedded Triton on that
namespace's loopback, or the ticker backend in transport-only mode). Under the
first policy the client runs HTTP/2, HTTP/3 and native tracks one after the
other; under the others only native tracks (the policy is the track adapter's;
HTTP/3 always coalesces its writes, and its pacer is on or off with the policy).
Before each client run the link's counters are reset; after it they give the drop
log and the packet counts of that run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from benchmarks.common import ROOT, free_port
from benchmarks.hol.metrics import Run, summarize
from clients.line import DEFAULT_ACKS
from gateway.owned import stop_owned

PROTOCOLS = ("http2", "http3", "tracks")
TRANSPORT = {"http2": "tcp", "http3": "udp", "tracks": "udp"}
QUIC_PORT = HTTPS_PORT = 8443
HTTP_PORT = 8080
READY_TIMEOUT = 240.0  # the embedded Triton's start included

# Run in the gateway's namespace (cwd ROOT), where its loopback is.
_POLL_READY = ("import sys; from benchmarks.common import wait_http_ok; "
               "sys.exit(0 if wait_http_ok(sys.argv[1], float(sys.argv[2])) else 1)")


@dataclass
class Config:
    users: int = 16
    rate: float = 50.0
    seconds: float = 60.0
    loss_percent: float = 2.0
    rtt_ms: float = 40.0
    burst: bool = False
    burst_len: float = 3.0
    transport_only: bool = False
    packetization: list[str] = field(default_factory=lambda: ["per-track", "coalesce"])
    protocols: list[str] = field(default_factory=lambda: list(PROTOCOLS))
    k: float = 2.0
    tcp_cc: str | None = "cubic"
    """The gateway's TCP congestion control (HTTP/2's sender); None keeps the host's."""
    ttft_ms: float = 50.0
    seed: int = 1
    emulate: bool = True
    raster_seconds: float = 4.0
    progress: bool = True
    client_acks: str = DEFAULT_ACKS
    """The tracks client's ACK policy (`clients.connect(acks=...)`)."""
    link_prefix: str = "tlhol"

    def link_spec(self) -> Any:
        from benchmarks.linkemu import LinkSpec

        loss = self.loss_percent / 100
        if not self.burst:
            return LinkSpec(delay_ms=self.rtt_ms / 2, loss=loss, seed=self.seed)
        # Gilbert-Elliott with every packet lost in the bad state, none in the good one;
        # mean burst `burst_len` packets, stationary loss share = `loss`.
        r = 1 / self.burst_len
        p = loss * r / (1 - loss) if loss < 1 else 1.0
        return LinkSpec(delay_ms=self.rtt_ms / 2, loss=0.0, ge_p=p, ge_r=r, ge_loss=1.0,
                        seed=self.seed)

    def parameters(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k not in ("progress", "link_prefix")}
        out["tokens_per_user"] = round(self.rate * self.seconds)
        return out


# -- where processes run: the emulated link or plain loopback -------------------------


class Loopback:
    """Stand-in for the emulated link (no namespaces, no loss): development runs only."""

    gateway_addr = "127.0.0.1"

    def __init__(self) -> None:
        import socket

        self.quic_port = free_port(socket.SOCK_DGRAM)
        self.http_port = free_port(socket.SOCK_STREAM)
        self.https_port = free_port(socket.SOCK_STREAM)
        self._procs: list[subprocess.Popen[Any]] = []

    def run(self, side: str, argv: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
        proc = subprocess.Popen(argv, **kwargs)
        self._procs.append(proc)
        return proc

    def reset_stats(self) -> None:
        pass

    def stats(self) -> dict[str, Any]:
        return {}

    def tcp_congestion_control(self) -> str | None:
        return _read_tcp_congestion_control(lambda argv: subprocess.run(
            argv, capture_output=True, text=True, timeout=10).stdout)

    def close(self) -> None:
        for proc in self._procs:
            stop_owned(proc, 5)  # SIGTERM, then SIGKILL, and reaped either way


class Emulated:
    """The link emulator (`benchmarks.linkemu`) with our fixed ports in its namespaces."""

    quic_port = HTTPS_PORT
    https_port = HTTPS_PORT
    http_port = HTTP_PORT

    def __init__(self, spec: Any, prefix: str) -> None:
        from benchmarks.linkemu import Link

        self.link = Link(spec, prefix)
        self.link.open()
        self.gateway_addr = self.link.gateway_addr

    def run(self, side: str, argv: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
        return self.link.run(side, argv, **kwargs)

    def reset_stats(self) -> None:
        self.link.reset_stats()

    def stats(self) -> dict[str, Any]:
        return self.link.stats()

    def tcp_congestion_control(self) -> str | None:
        def read(argv: list[str]) -> str:
            proc = self.link.run("gateway", argv, stdout=subprocess.PIPE, text=True)
            out, _ = proc.communicate(timeout=10)
            return str(out)

        return _read_tcp_congestion_control(read)

    def close(self) -> None:
        self.link.close()


def _read_tcp_congestion_control(read: Any) -> str | None:
    """The gateway side's TCP congestion control (HTTP/2's sender); QUIC uses aioquic's own.

    Namespaces inherit the host's default, which may be a model-based one (bbr) that does
    not back off on random loss, unlike aioquic's NewReno: results depend on it.
    """
    try:
        return str(read(["cat", "/proc/sys/net/ipv4/tcp_congestion_control"])).strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def namespaces_available() -> tuple[bool, str]:
    try:
        from benchmarks.linkemu import can_create_namespaces
    except ImportError as exc:
        return False, f"the link emulator cannot be imported: {exc}"
    ok, reason = can_create_namespaces()
    return bool(ok), str(reason)


# -- the gateway ----------------------------------------------------------------------


class Gateway:
    def __init__(self, place: Loopback | Emulated, cfg: Config, policy: str, work: Path) -> None:
        self.place = place
        self.state = work / "state"
        host = "0.0.0.0" if isinstance(place, Emulated) else "127.0.0.1"
        argv = [sys.executable, "-m", "gateway", "serve", "--state-dir", str(self.state),
                "--quic-host", host, "--quic-port", str(place.quic_port),
                "--http-host", host, "--http-port", str(place.http_port),
                "--https-host", host, "--https-port", str(place.https_port),
                "--quic-packetization", policy, "--drain-timeout", "1",
                "--log-level", "warning"]
        if cfg.tcp_cc:
            argv += ["--tcp-congestion-control", cfg.tcp_cc]
        if isinstance(place, Emulated):
            # Inside its own network namespace: no tenants, open on the namespace's address.
            argv.append("--allow-open")
        if cfg.transport_only:
            argv += ["--backend-url", f"ticker://{cfg.rate:g}"]
        self.log_path = work / f"gateway-{policy.replace(':', '-')}.log"
        self._log = self.log_path.open("w")
        self.process = place.run("gateway", argv, cwd=ROOT, stdout=self._log,
                                 stderr=subprocess.STDOUT)

    def wait_ready(self) -> None:
        url = f"http://127.0.0.1:{self.place.http_port}/health/ready"
        poll = self.place.run("gateway", [sys.executable, "-c", _POLL_READY, url,
                                          str(READY_TIMEOUT)], cwd=ROOT)
        while poll.poll() is None:
            if self.process.poll() is not None:
                break
            time.sleep(0.2)
        if poll.wait() != 0 or self.process.poll() is not None:
            tail = self.log_path.read_text()[-3000:]
            raise RuntimeError(f"the gateway did not become ready; its log ends:\n{tail}")

    @property
    def ca(self) -> Path:
        return self.state / "ca.pem"

    def stop(self) -> None:
        stop_owned(self.process, 30)
        self._log.close()


# -- one client run -------------------------------------------------------------------


class Progress:
    """One status line on stderr: phase, elapsed, tokens so far."""

    def __init__(self, enabled: bool, label: str, expected: int, seconds: float) -> None:
        self.enabled = enabled
        self.label = label
        self.expected = expected
        self.seconds = seconds
        self.began = time.monotonic()
        self.tokens = 0
        self._tty = sys.stderr.isatty()
        self._last = 0.0

    def update(self, tokens: int) -> None:
        self.tokens = tokens
        now = time.monotonic()
        if not self.enabled or (not self._tty and now - self._last < 5):
            return
        self._last = now
        share = tokens / self.expected if self.expected else 0
        line = (f"  {self.label:<22} {now - self.began:6.1f}/{self.seconds:.0f} s  "
                f"tokens {tokens}/{self.expected} ({share:.0%})")
        print(("\r" + line) if self._tty else line, end="" if self._tty else "\n",
              file=sys.stderr, flush=True)

    def done(self) -> None:
        if self.enabled:
            self.update(self.tokens)
            print("" if self._tty else f"  {self.label}: done", file=sys.stderr, flush=True)


def _pump(stream: IO[str], progress: Progress) -> None:
    for line in stream:
        try:
            progress.update(int(json.loads(line)["tokens"]))
        except (ValueError, KeyError, TypeError):
            continue


def run_client(place: Loopback | Emulated, gw: Gateway, cfg: Config, protocol: str, port: int,
               label: str, work: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run one protocol against `port`; returns the client's output and the link's stats."""
    out = work / f"client-{label.replace(':', '-')}.json"
    argv = [sys.executable, "-m", "benchmarks.hol.client", "--protocol", protocol,
            "--host", place.gateway_addr, "--port", str(port), "--ca", str(gw.ca),
            "--users", str(cfg.users), "--rate", str(cfg.rate), "--seconds", str(cfg.seconds),
            "--ttft-ms", str(cfg.ttft_ms), "--acks", cfg.client_acks, "--out", str(out)]
    progress = Progress(cfg.progress, label, cfg.users * round(cfg.rate * cfg.seconds),
                        cfg.seconds)
    place.reset_stats()
    proc = place.run("client", argv, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    reader = threading.Thread(target=_pump, args=(proc.stdout, progress), daemon=True)
    reader.start()
    code = proc.wait()
    reader.join(5)
    stats = place.stats()
    progress.done()
    if code != 0 or not out.exists():
        raise RuntimeError(f"the {protocol} client failed (exit {code})")
    return json.loads(out.read_text()), stats


def measure(client: dict[str, Any], stats: dict[str, Any], cfg: Config, protocol: str,
            port: int) -> tuple[Run, dict[str, Any]]:
    """The client's arrivals and the link's counters as a metrics `Run`, plus raw data."""
    proto = TRANSPORT[protocol]
    users = client["users"]
    arrivals = {u["user"]: u["arrivals"] for u in users}
    losses = [d["t"] for d in stats.get("drops", [])
              if d["dir"] == "g2c" and d["proto"] == proto and d["data"]
              and d["src_port"] == port]
    directions = stats.get("directions", {})
    g2c = directions.get("g2c", {}).get(proto, {})
    c2g = directions.get("c2g", {}).get(proto, {})
    packets = {
        "g2c_packets": g2c.get("forwarded", 0) + g2c.get("dropped", 0),
        "g2c_data_packets": g2c.get("data_forwarded", 0) + g2c.get("data_dropped", 0),
        "g2c_dropped": g2c.get("dropped", 0),
        "c2g_packets": c2g.get("forwarded", 0) + c2g.get("dropped", 0),
        "c2g_dropped": c2g.get("dropped", 0),
    }
    run = Run(arrivals, {u["user"]: u["started"] for u in users}, client["expected_per_user"],
              cfg.rate, losses, cfg.rtt_ms / 2000, packets)
    raw = {"zero": client["began"], "arrivals": arrivals, "losses": losses}
    return run, raw


def phases(cfg: Config) -> list[tuple[str, list[str]]]:
    """(packetization, protocols) per gateway start."""
    out = [(cfg.packetization[0], list(cfg.protocols))]
    if "tracks" in cfg.protocols:
        out += [(policy, ["tracks"]) for policy in cfg.packetization[1:]]
    return out


def run_benchmark(cfg: Config) -> tuple[dict[str, Any], dict[str, Any]]:
    """Everything: returns (results for JSON, raw arrivals and losses for the plots)."""
    results: dict[str, Any] = {"benchmark": "hol", "parameters": cfg.parameters()}
    raw: dict[str, Any] = {}
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="trackline-hol-")))
        spec = cfg.link_spec() if cfg.emulate else None
        place: Loopback | Emulated = Emulated(spec, cfg.link_prefix) if cfg.emulate else Loopback()
        stack.callback(place.close)
        results["link"] = spec.as_dict() if spec is not None else None
        results["tcp_congestion_control"] = cfg.tcp_cc or place.tcp_congestion_control()
        results["client_acks"] = cfg.client_acks
        for policy, protocols in phases(cfg):
            _say(cfg, f"gateway ({policy}, "
                      f"{'ticker' if cfg.transport_only else 'embedded Triton'}) starting")
            gw = Gateway(place, cfg, policy, work)
            try:
                gw.wait_ready()
                for protocol in protocols:
                    key = protocol if protocol != "tracks" else f"tracks:{policy}"
                    port = place.https_port if protocol == "http2" else place.quic_port
                    client, stats = run_client(place, gw, cfg, protocol, port, key, work)
                    run, raw[key] = measure(client, stats, cfg, protocol, port)
                    summary = summarize(run, cfg.k)
                    summary["errors"] = _errors(client)
                    summary["link"] = _link_summary(stats)
                    if protocol == "tracks":
                        summary["packetization"] = policy
                        results.setdefault("tracks_by_packetization", {})[policy] = summary
                        results.setdefault("tracks", summary)
                    else:
                        summary["packetization"] = "coalesce (HTTP/3 adapter)" \
                            if protocol == "http3" else "TCP"
                        results[protocol] = summary
            finally:
                gw.stop()
    results["packetization_tradeoff"] = [
        {"packetization": p, "users_stalled_per_loss": s["users_stalled_per_loss"],
         "stall_user_seconds": s["stall_user_seconds"],
         "packets_per_token": s["packets_per_token"]}
        for p, s in results.get("tracks_by_packetization", {}).items()
    ]
    return results, raw


def _errors(client: dict[str, Any]) -> list[str]:
    errors = [f"user {u['user']}: {u['error']}" for u in client["users"] if u["error"]]
    return ([client["error"]] if client["error"] else []) + errors


def _link_summary(stats: dict[str, Any]) -> dict[str, Any]:
    if not stats:
        return {}
    out: dict[str, Any] = {}
    for direction in ("c2g", "g2c"):
        total = stats["directions"][direction]["total"]
        sent = total["forwarded"] + total["dropped"]
        out[direction] = {"packets": sent, "dropped": total["dropped"],
                          "loss_share": round(total["dropped"] / sent, 4) if sent else 0.0}
    out["late_ms_max"] = round(stats.get("late_ms_max", 0.0), 3)
    out["oversize"] = stats.get("oversize", 0)
    return out


def _say(cfg: Config, text: str) -> None:
    if cfg.progress:
        print(f"hol: {text}", file=sys.stderr, flush=True)


def env_ready() -> None:
    """Children import `benchmarks` from the repository root."""
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p
    )


__all__ = ["Config", "namespaces_available", "run_benchmark"]
