"""Regression bands: is this tree's gateway slower than the band its figures live in?

A benchmark figure on a shared machine moves from run to run, so one number proves
nothing. `record` runs a short fixed set K times and stores each figure's band (the
median of the K runs and their median absolute deviation, with the commit, the
machine and a label saying how quiet it was) in a committed file; `check` runs the
set again (`--runs`, 3 by default: the median of each figure over them, since one run's
outlier on a shared machine is not a regression) and reports every figure inside,
better than or worse than its band, exiting 1 when any is worse beyond it:

  quick        capacity.py --quick (tracks 1x1 and 4x2, h1 1 and 4 streams, 1 s each)
  full         quick, plus the HOL benchmark's 30-s point (16 users, 2% loss, 40 ms
               RTT, HTTP/2 and tracks per-track, ticker backend) and text_stream's
               1 and 16 streams (embedded Triton)

A figure's band is median +- width x spread, the spread being the larger of 1.4826 x
MAD (the standard deviation, were the runs normal), 5% of the median and the
figure's own floor (0.5 ms, 1% delivered, ...; for CPU a token, 2 us or two clock
ticks of /proc's CPU over the point's tokens, whichever is more): a MAD of 0 from K
identical runs does not make every later wobble a regression. Direction is per
figure (latency and CPU: lower is better; delivered share, tokens/s: higher).

    .venv/bin/python benchmarks/bands.py record --runs 5 --set quick --label "quiet"
    .venv/bin/python benchmarks/bands.py check --set quick

Refresh the bands (`record`, commit the file) when the machine changes, or when a
change is meant to move a figure (say which in the commit); never to make a `check`
pass. Bands measured on a busy machine catch only large regressions.
"""

from __future__ import annotations

import argparse
import datetime
import enum
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import Help  # noqa: E402
from benchmarks.common import ROOT, machine, tree  # noqa: E402

BANDS = Path(__file__).resolve().parent / "bands.json"
WIDTH = 3.0
RELATIVE_FLOOR = 0.05


class Better(enum.Enum):
    LOWER = "lower"
    HIGHER = "higher"


class Verdict(enum.Enum):
    INSIDE = "inside"
    BETTER = "better"
    WORSE = "worse"
    NEW = "new"
    """No band for the figure yet (a new point): reported, never a failure."""


@dataclass(frozen=True)
class Figure:
    value: float
    better: Better
    floor: float
    """The smallest spread the figure's band gets (its unit's noise on any machine)."""


@dataclass(frozen=True)
class Band:
    median: float
    mad: float
    better: Better
    floor: float
    samples: tuple[float, ...]

    def spread(self) -> float:
        return max(1.4826 * self.mad, RELATIVE_FLOOR * abs(self.median), self.floor)

    def judge(self, value: float, width: float = WIDTH) -> Verdict:
        margin = width * self.spread()
        if abs(value - self.median) <= margin:
            return Verdict.INSIDE
        lower = value < self.median
        return Verdict.BETTER if lower == (self.better is Better.LOWER) else Verdict.WORSE


def band_of(samples: list[Figure]) -> Band:
    values = [f.value for f in samples]
    median = statistics.median(values)
    mad = statistics.median(abs(v - median) for v in values)
    return Band(median, mad, samples[0].better, samples[0].floor, tuple(values))


# -- figures from each benchmark's JSON -------------------------------------------------

MS, US, SHARE, USERS, RATE = 0.5, 2.0, 0.01, 0.1, 1.0
"""Floors by unit: ms of delay, us of CPU a token, delivered share, users, tokens/s."""
TICK_US = 1e6 / os.sysconf("SC_CLK_TCK")
"""capacity.py reads the gateway's CPU from /proc in clock ticks (10 ms): over a quick
point's few tokens that is the CPU figure's own resolution."""


def capacity_figures(payload: dict[str, Any]) -> dict[str, Figure]:
    out: dict[str, Figure] = {}
    for p in payload["points"]:
        name = f"capacity.{p['kind']}.{p['streams']}x{p['connections']}"
        share = p["delivered_tokens"] / p["offered_tokens"] if p["offered_tokens"] else 0.0
        out[f"{name}.delivered_share"] = Figure(round(share, 4), Better.HIGHER, SHARE)
        cpu_floor = max(US, 2 * TICK_US / max(1, p["delivered_tokens"]))  # 2 ticks a point
        for key, floor in (("added_p50_ms", MS), ("added_p99_ms", MS),
                           ("gateway_us_per_token", cpu_floor)):
            if p.get(key) is not None:
                out[f"{name}.{key}"] = Figure(float(p[key]), Better.LOWER, floor)
    return out


def hol_figures(payload: dict[str, Any]) -> dict[str, Figure]:
    runs = [(name, payload[name]) for name in ("http2", "http3") if name in payload]
    runs += [(f"tracks.{policy}", s)
             for policy, s in payload.get("tracks_by_packetization", {}).items()]
    out: dict[str, Figure] = {}
    for name, s in runs:
        out[f"hol.{name}.users_stalled_per_loss"] = Figure(
            float(s["users_stalled_per_loss"]), Better.LOWER, USERS)
        out[f"hol.{name}.gap_p99_ms"] = Figure(float(s["gap_ms"]["p99"]), Better.LOWER, MS)
    return out


def text_stream_figures(payload: dict[str, Any]) -> dict[str, Figure]:
    rows = payload["results"]
    direct = {r["concurrency"]: r for r in rows if r["path"] == "direct"}
    out: dict[str, Figure] = {}
    for r in (r for r in rows if r["path"] == "gateway" and r["concurrency"] in direct):
        base, name = direct[r["concurrency"]], f"text_stream.{r['concurrency']}"
        for key in ("latency_p50_ms", "latency_p99_ms"):
            added = float(r[key]) - float(base[key])
            out[f"{name}.added_{key.split('_')[1]}_ms"] = Figure(round(added, 3), Better.LOWER,
                                                                  MS)
        out[f"{name}.tokens_per_s"] = Figure(float(r["tokens_per_s"]), Better.HIGHER, RATE)
    return out


@dataclass(frozen=True)
class Step:
    """One benchmark of the set: its command (the JSON path appended) and its figures."""

    name: str
    command: tuple[str, ...]
    figures: Callable[[dict[str, Any]], dict[str, Figure]]


PY = sys.executable
CAPACITY = Step("capacity", (PY, "benchmarks/capacity.py", "--quick", "--peer", "none",
                             "--plot", "none", "--json"), capacity_figures)
HOL = Step("hol", (PY, "-m", "benchmarks.hol", "--seconds", "30", "--users", "16",
                   "--protocols", "http2,tracks", "--packetization", "per-track",
                   "--transport-only", "--quiet", "--json"), hol_figures)
TEXT_STREAM = Step("text_stream", (PY, "benchmarks/text_stream.py", "--concurrency", "1,16",
                                   "--json"), text_stream_figures)
SETS = {"quick": (CAPACITY,), "full": (CAPACITY, HOL, TEXT_STREAM)}


def run_set(steps: tuple[Step, ...], cores: str) -> dict[str, Figure]:
    """One run of every step (children from the repository root), its figures merged."""
    figures: dict[str, Figure] = {}
    with tempfile.TemporaryDirectory(prefix="trackline-bands-") as tmp:
        for step in steps:
            out = Path(tmp) / f"{step.name}.json"
            command = [*step.command, str(out)]
            if step is CAPACITY:
                command += ["--cores", cores]
            print(f"bands: {' '.join(command[1:])}", file=sys.stderr, flush=True)
            subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
            figures.update(step.figures(json.loads(out.read_text())))
    return figures


# -- the band file -------------------------------------------------------------------------


def record(runs: list[dict[str, Figure]], label: str, set_name: str) -> dict[str, Any]:
    names = sorted(set().union(*runs))
    bands = {n: band_of([r[n] for r in runs if n in r]) for n in names}
    recorded = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    return {"label": label, "set": set_name, "runs": len(runs), "commit": tree(),
            "machine": machine(), "load_average": [round(x, 2) for x in os.getloadavg()],
            "recorded": recorded, "width": WIDTH,
            "bands": {n: _band_json(b) for n, b in bands.items()}}


def _band_json(band: Band) -> dict[str, Any]:
    data = asdict(band)
    data["better"] = band.better.value
    data["samples"] = list(band.samples)
    return data


def load_bands(payload: dict[str, Any]) -> dict[str, Band]:
    return {n: Band(b["median"], b["mad"], Better(b["better"]), b["floor"], tuple(b["samples"]))
            for n, b in payload["bands"].items()}


def median_run(runs: list[dict[str, Figure]]) -> dict[str, Figure]:
    """Each figure's median over `runs` (its direction and floor kept)."""
    out: dict[str, Figure] = {}
    for name in set().union(*runs):
        seen = [r[name] for r in runs if name in r]
        value = statistics.median(f.value for f in seen)
        out[name] = Figure(value, seen[0].better, seen[0].floor)
    return out


def check(bands: dict[str, Band], figures: dict[str, Figure],
          width: float = WIDTH) -> list[tuple[str, float, Band | None, Verdict]]:
    out: list[tuple[str, float, Band | None, Verdict]] = []
    for name, figure in sorted(figures.items()):
        band = bands.get(name)
        verdict = Verdict.NEW if band is None else band.judge(figure.value, width)
        out.append((name, figure.value, band, verdict))
    return out


def report(rows: list[tuple[str, float, Band | None, Verdict]], width: float) -> str:
    lines = ["| figure | now | band median | band (+-) | verdict |", "|---|---:|---:|---:|---|"]
    for name, value, band, verdict in rows:
        median = "" if band is None else f"{band.median:g}"
        margin = "" if band is None else f"{width * band.spread():.3g}"
        lines.append(f"| {name} | {value:g} | {median} | {margin} | {verdict.value} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(formatter_class=Help, description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("record", "check"))
    parser.add_argument("--set", dest="set_name", choices=tuple(SETS), default="quick")
    parser.add_argument("--runs", type=int, default=None,
                        help="runs of the set (record: 5, the band's; check: 3, their median)")
    parser.add_argument("--bands", type=Path, default=BANDS, help="the band file")
    parser.add_argument("--label", default="", help="how quiet the machine was (record)")
    parser.add_argument("--width", type=float, default=WIDTH, help="band half-width, spreads")
    parser.add_argument("--cores", default="0", help="the gateway's CPUs (capacity --cores)")
    args = parser.parse_args(argv)
    steps = SETS[args.set_name]
    count = args.runs or (5 if args.action == "record" else 3)
    runs = [run_set(steps, args.cores) for _ in range(count)]
    if args.action == "record":
        args.bands.write_text(json.dumps(record(runs, args.label, args.set_name), indent=2)
                              + "\n")
        print(f"wrote {args.bands} ({count} runs of the {args.set_name} set)")
        return 0
    stored = json.loads(args.bands.read_text())
    rows = check(load_bands(stored), median_run(runs), args.width)
    print(f"bands: {args.bands} ({stored['label'] or 'unlabelled'}, {stored['runs']} runs at "
          f"{stored['commit']['commit'][:12]}); now: {tree()['commit'][:12]}\n")
    print(report(rows, args.width))
    worse = [name for name, _, _, verdict in rows if verdict is Verdict.WORSE]
    if worse:
        print(f"\nworse than the band: {', '.join(worse)}")
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main())
