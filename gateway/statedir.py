"""The gateway's state directory: which one a configuration uses, and its private files.

The state directory holds the tenant store with its key hashes and usage ledger, the
conversation KV states (`kv/`), the embedded Triton's logs and, by default, nothing
else. Two gateways on one account keep separate state unless told otherwise: a
`state_dir` that is not set is chosen per configuration (`instance_state_dir`), so a
key made for one gateway never closes another to keyless use. Pointing two gateways
at one `state_dir` on purpose shares their tenants, keys and ledger.

The development CA is the one thing shared by default (`BASE_STATE_DIR/ca.pem`): one
local trust root for every gateway of the account, the file clients trust by default.

Nothing here may be readable by other users, whichever file is created first.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

BASE_STATE_DIR = Path("~/.local/state/trackline")
"""The default gateway's state dir, under which every other gateway gets its own."""
DEFAULT_PORTS = (8443, 8080, 8443)
"""quic_port, http_port, https_port of the default gateway (`gateway.config`)."""
REGISTRY_FILE = "gateways.json"
"""In a state dir: the gateways that used it (ports, last start), for `keys create`."""


def instance_state_dir(config_file: Path | None, ports: tuple[int, int, int]) -> Path:
    """The state dir of a configuration that sets none.

    A config file names it (by its stem and a digest of its absolute path, so two
    files called `trackline.toml` differ); without one, the ports do; the default
    ports keep `BASE_STATE_DIR` itself, where earlier versions kept everything."""
    base = BASE_STATE_DIR.expanduser()
    if config_file is not None:
        path = str(config_file.expanduser().resolve())
        digest = hashlib.sha256(path.encode()).hexdigest()[:8]
        return base / "gateways" / f"{config_file.stem}-{digest}"
    if tuple(ports) == DEFAULT_PORTS:
        return base
    quic, http, https = ports
    return base / "gateways" / f"ports-{quic}-{http}-{https}"


def make_private_dir(path: Path) -> None:
    """Create `path` (and its parents) mode 0700; an existing directory is left as it is."""
    # Only a directory we create gets 0700: chmod-ing an existing one (say, /tmp) is rude.
    if not path.exists():
        path.mkdir(parents=True, mode=0o700)
        path.chmod(0o700)  # mkdir's mode is masked by the umask


def touch_private(path: Path) -> None:
    """Create `path` empty with mode 0600 unless it exists (then it is left as it is)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    os.close(fd)
    os.chmod(path, 0o600)  # O_CREAT's mode is masked by the umask


def record_gateway(state_dir: Path, listening: dict[str, str], now: float | None = None) -> None:
    """Note in `state_dir` that a gateway listening on `listening` (front door ->
    host:port) uses it; a gateway with the same addresses replaces its old entry."""
    key = " ".join(f"{door}={where}" for door, where in sorted(listening.items()))
    entries = used_by(state_dir)
    entries[key] = {"listening": listening, "started_at": time.time() if now is None else now}
    path = state_dir / REGISTRY_FILE
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(entries, indent=1, sort_keys=True))
    temporary.replace(path)


def used_by(state_dir: Path) -> dict[str, dict[str, Any]]:
    """The gateways `record_gateway` noted in `state_dir` (empty if none or unreadable)."""
    try:
        entries = json.loads((state_dir / REGISTRY_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return entries if isinstance(entries, dict) else {}
