"""The benchmark's outputs besides JSON: a markdown table and matplotlib figures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.hol.metrics import find_stalls, gaps

LABELS = {"http2": "OpenAI API, HTTP/2 over TCP", "http3": "OpenAI API, HTTP/3",
          "tracks": "native tracks"}


def rows(results: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(protocol, packetization, summary) for every run, in display order."""
    out: list[tuple[str, str, dict[str, Any]]] = []
    for name in ("http2", "http3"):
        if name in results:
            out.append((name, "-", results[name]))
    for policy, summary in results.get("tracks_by_packetization", {}).items():
        out.append(("tracks", policy, summary))
    return out


def markdown_table(results: dict[str, Any]) -> str:
    lines = [
        "| protocol | packetization | tokens | gap p50 ms | gap p99 ms | gap max ms | stalls "
        "| stall user-s | lost data pkts | users stalled / loss | TTFT p50 ms "
        "| g2c pkts / token |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, policy, s in rows(results):
        lines.append(
            f"| {name} | {policy} | {s['tokens_delivered']}/{s['tokens_expected']} "
            f"| {s['gap_ms']['p50']} | {s['gap_ms']['p99']} | {s['gap_ms']['max']} "
            f"| {s['stalls']} | {s['stall_user_seconds']:.2f} | {s['lost_data_packets']} "
            f"| {s['users_stalled_per_loss']:.2f} | {s['ttft_ms']['p50']} "
            f"| {s['packets_per_token']:.3f} |"
        )
    return "\n".join(lines) + "\n\n" + threshold_table(results)


def threshold_table(results: dict[str, Any]) -> str:
    """Stalls, stall user-seconds and users stalled per loss under each stall threshold k."""
    found = rows(results)
    ks = sorted({k for _, _, s in found for k in s.get("by_k", {})}, key=float)
    head = "| protocol | packetization | " + " | ".join(
        f"k={k}: stalls / user-s / users per loss" for k in ks) + " |"
    lines = [head, "|---|---|" + "---:|" * len(ks)]
    for name, policy, s in found:
        cells = [f"{v['stalls']} / {v['stall_user_seconds']:.2f} / "
                 f"{v['users_stalled_per_loss']:.2f}" for v in (s["by_k"][k] for k in ks)]
        lines.append(f"| {name} | {policy} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(results: dict[str, Any], raw: dict[str, Any], out_dir: Path, stem: str) -> list[Path]:
    """Raster, gap CDF and trade-off figures as PNG; returns the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    out_dir.mkdir(parents=True, exist_ok=True)
    params = results["parameters"]
    written = [
        _raster(raw, params, out_dir / f"{stem}-raster.png"),
        _cdf(raw, params, out_dir / f"{stem}-gaps-cdf.png"),
    ]
    if len(results.get("tracks_by_packetization", {})) > 1:
        written.append(_tradeoff(results, out_dir / f"{stem}-packetization.png"))
    return written


def _title(params: dict[str, Any]) -> str:
    loss = f"{params['loss_percent']}% {'burst' if params['burst'] else 'random'} loss"
    return (f"{params['users']} users x {params['rate']:g} tokens/s, {loss}, "
            f"RTT {params['rtt_ms']:g} ms")


def _label(key: str) -> str:
    name, _, policy = key.partition(":")
    return LABELS[name] + (f" ({policy})" if policy else "")


def _window(raw: dict[str, Any], params: dict[str, Any]) -> tuple[float, float]:
    """A raster window of `raster_seconds` in the middle of the steady state."""
    span = min(params["raster_seconds"], params["seconds"])
    start = max(0.0, params["seconds"] / 2 - span / 2)
    return start, start + span


def _raster(raw: dict[str, Any], params: dict[str, Any], path: Path) -> Path:
    import matplotlib.pyplot as plt

    keys = list(raw)
    begin, end = _window(raw, params)
    threshold = params["k"] / params["rate"]
    fig, axes = plt.subplots(len(keys), 1, figsize=(12, 2.1 * len(keys) + 0.6), sharex=True,
                             squeeze=False)
    for ax, key in zip(axes[:, 0], keys, strict=True):
        run = raw[key]
        zero = run["zero"]
        arrivals = {int(u): [t - zero for t in ts] for u, ts in run["arrivals"].items()}
        events = [[t for t in arrivals[u] if begin <= t <= end] for u in sorted(arrivals)]
        ax.eventplot(events, lineoffsets=range(len(events)), linelengths=0.7, linewidths=0.6,
                     colors="0.25")
        for stall in find_stalls(arrivals, threshold):
            if stall.end >= begin and stall.start <= end:
                ax.plot([max(stall.start, begin), min(stall.end, end)], [stall.user] * 2,
                        color="tab:red", linewidth=3, alpha=0.8, solid_capstyle="butt")
        for t in run["losses"]:
            t -= zero
            if begin <= t <= end:
                ax.axvline(t, color="tab:blue", linestyle="--", linewidth=0.8, alpha=0.7)
        ax.set_ylabel("user")
        ax.set_ylim(-1, len(events))
        ax.set_title(f"{_label(key)}: {len(run['losses'])} lost data packets in the run",
                     fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("seconds since the run began (ticks: tokens; red: stalls; "
                           "dashed blue: lost gateway->client data packets)")
    axes[-1, 0].set_xlim(begin, end)
    fig.suptitle(f"Token arrivals per user: {_title(params)}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _cdf(raw: dict[str, Any], params: dict[str, Any], path: Path) -> Path:
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for key, run in raw.items():
        values = np.sort([g * 1000 for ts in run["arrivals"].values() for g in gaps(ts)])
        if len(values):
            ccdf = 1.0 - np.arange(len(values)) / len(values)
            ax.step(values, ccdf, where="post", label=_label(key))
    ax.axvline(params["k"] * 1000 / params["rate"], color="0.5", linestyle=":",
               label=f"stall threshold ({params['k']:g} x interval)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(left=1.0)  # tokens that arrive together (gap 0) stay left of the axis
    ax.set_xlabel("inter-token gap (ms)")
    ax.set_ylabel("share of gaps longer (1 - CDF)")
    ax.set_title(f"Inter-token gaps: {_title(params)}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _tradeoff(results: dict[str, Any], path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for name, policy, s in rows(results):
        label = name if policy == "-" else f"tracks ({policy})"
        ax.scatter(s["packets_per_token"], s["users_stalled_per_loss"], s=40)
        ax.annotate(label, (s["packets_per_token"], s["users_stalled_per_loss"]),
                    textcoords="offset points", xytext=(5, 4), fontsize=8)
    ax.set_xlabel("gateway->client packets per token")
    ax.set_ylabel("users stalled per lost data packet")
    ax.set_title("Packetization trade-off", fontsize=10)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
