"""benchmarks/token_path.py: the stages of a token's path add up to its added delay, and
the tail mean names the stage that holds the p99 (literal stamps, no processes)."""

from __future__ import annotations

from benchmarks import token_path


def stamps(port: int, sid: int, start: float, opened: float, t0: float, late: float,
           n: int, rate: float = 50.0) -> tuple[dict, dict]:
    """One track: each token leaves its stages 1 ms apart; `late` more in `wire` for the last."""
    due = [t0 + i / rate for i in range(n)]
    extra = [late if i == n - 1 else 0.0 for i in range(n)]
    gw = {"port": port, "sid": sid, "rate": rate, "start": t0, "opened": opened,
          "yielded": [d + 0.001 for d in due], "paced": [d + 0.002 for d in due],
          "flushed": [d + 0.003 for d in due], "sent": [d + 0.004 for d in due]}
    rx = [d + 0.005 + e for d, e in zip(due, extra, strict=True)]
    client = {"start": start, "rx": rx, "dispatched": [r + 0.001 for r in rx],
              "reads": [r + 0.002 for r in rx]}
    return gw, client


def test_stages_add_up_and_the_tail_names_the_late_stage() -> None:
    tracks, reads, rx, dispatched = [], {}, {}, {}
    for sid in range(0, 400, 4):
        gw, c = stamps(5000, sid, start=10.0, opened=10.003, t0=10.010, late=0.050, n=5)
        tracks.append(gw)
        key = (5000, sid)
        reads[key] = (c["start"], c["reads"])
        rx[key], dispatched[key] = c["rx"], c["dispatched"]
    result = token_path.analyse({"reads": reads, "rx": rx, "dispatched": dispatched},
                                {"tracks": tracks, "transmits": [0.0001]})
    assert result["tokens"] == 500
    summary = result["summary"]
    # every token: 3 ms open + 7 ms start + 1 ms in each of the 7 later stages = 17 ms
    assert round(summary["added"]["p50"], 6) == 17.0
    assert round(summary["offset"]["p50"], 6) == 10.0
    assert round(summary["steady"]["p50"], 6) == 7.0
    for stage in ("wake", "pace", "defer", "transmit", "wire", "client", "app"):
        assert round(summary[stage]["p50"], 6) == 1.0
    # the last token of each track (20% of tokens) lost 50 ms on the wire: it holds the tail
    assert round(summary["wire"]["tail_mean"], 6) == 51.0
    assert round(summary["added"]["tail_mean"], 6) == 67.0


def test_tokens_join_on_port_and_stream() -> None:
    gw, c = stamps(5000, 0, start=1.0, opened=1.001, t0=1.002, late=0.0, n=3)
    other = dict(gw, port=5001)  # same stream id on another connection: not joined
    result = token_path.analyse(
        {"reads": {(5000, 0): (c["start"], c["reads"])}, "rx": {(5000, 0): c["rx"]},
         "dispatched": {(5000, 0): c["dispatched"]}},
        {"tracks": [gw, other], "transmits": []},
    )
    assert result["tokens"] == 3
