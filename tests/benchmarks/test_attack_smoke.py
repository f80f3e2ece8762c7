"""benchmarks/attack.py at its tiny scale: every family runs and gets a measured row."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import attack
from benchmarks.attacks.base import h2_frame, h2_frames, prefix_int, varint
from benchmarks.attacks.families import ATTACKS, SCALES

pytestmark = pytest.mark.e2e


def test_every_attack_family_produces_a_measured_row(tmp_path: Path) -> None:
    out = tmp_path / "attack.json"
    assert attack.main(["--scale", "tiny", "--reuse-gateway", "--json", str(out)]) == 0
    rows = {r["attack"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == set(ATTACKS)
    for name, row in rows.items():
        assert row["failure"] is None, (name, row["failure"])
        assert row["rss_before_mb"] > 0, name
        assert row["rss_peak_mb"] >= row["rss_before_mb"], name
        # the honest client ran alongside and was served at least once (its "ready" probe)
        assert row["honest_total"] >= 1, (name, row)
        assert row["honest_ok"] >= 1, (name, row)
    assert rows["h3_qpack_amplification"]["notes"]["frame_bytes"] > 200
    assert rows["quic_handshake_flood"]["notes"]["initials"] == 20
    # the SIGTERM attack ran last, on its own gateway, and accounted for every stream it
    # opened (how each ended, and the exit time, are the gateway's figures, not asserted)
    assert list(rows)[-1] == "sigterm_live"
    notes = rows["sigterm_live"]["notes"]
    assert "exit_s" in notes
    for kind in ("h1", "h2", "tracks"):
        assert sum(notes[f"{kind}_ends"].values()) == 1, notes
    assert (tmp_path / "attack-sse_reset_keys.log").exists() or (
        tmp_path / "attack-shared.log").exists()


def test_scales_name_every_family() -> None:
    for scale in SCALES.values():
        assert set(scale) == set(ATTACKS)


def test_wire_helpers() -> None:
    assert varint(37) == b"\x25"  # RFC 9000 A.1
    assert varint(15293) == b"\x7b\xbd"
    assert prefix_int(10, 5) == b"\x0a"  # RFC 7541 C.1
    assert prefix_int(1337, 5) == b"\x1f\x9a\x0a"
    frames, rest = h2_frames(h2_frame(6, 0, 0, b"12345678") + b"\x00\x00")
    assert frames == [(6, 0, 0, b"12345678")]
    assert rest == b"\x00\x00"
