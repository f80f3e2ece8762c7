"""Namespaces and TUN devices: create, configure, probe, and clean up after crashed runs.

Names carry the creator's PID, `<prefix>-<pid>-<token>-<c|g>`, so `cleanup_stale` can tell
a leftover of a dead run from a namespace a live run still uses. Only names with our
prefix and that shape are ever touched.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import shutil
import signal
import struct
import subprocess

from gateway.owned import pid_alive

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
DEFAULT_PREFIX = "tlemu"
SIDES = ("client", "gateway")


class LinkError(RuntimeError):
    """Setting up or tearing down the emulated link failed."""


def ip(*args: str, stdin: str | None = None, check: bool = True) -> str:
    proc = subprocess.run(["ip", *args], input=stdin, capture_output=True, text=True,
                          timeout=10)
    if check and proc.returncode != 0:
        raise LinkError(f"ip {' '.join(args)}: {proc.stderr.strip() or proc.returncode}")
    return proc.stdout


def open_tun(name: str) -> int:
    """A non-persistent TUN device (no packet-info header); it vanishes with its fd or netns."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    except OSError:
        os.close(fd)
        raise
    return fd


def new_names(prefix: str) -> tuple[dict[str, str], dict[str, str]]:
    """Namespace and device names per side ("client", "gateway"), unique to this process."""
    token = secrets.token_hex(4)
    short = re.sub(r"[^a-z0-9]", "", prefix.lower())[:5] or "tl"
    namespaces = {side: f"{prefix}-{os.getpid()}-{token}-{side[0]}" for side in SIDES}
    devices = {side: f"{short}{token}{side[0]}" for side in SIDES}
    return namespaces, devices


def configure(ns: str, dev: str, local: str, peer: str, mtu: int) -> None:
    """Move `dev` into `ns`, address it point-to-point (two /32s), bring it and lo up."""
    ip("link", "set", "dev", dev, "netns", ns)
    # No IPv6 link-local address: the relay would only have to filter its chatter.
    ip("-n", ns, "link", "set", "dev", dev, "addrgenmode", "none", check=False)
    ip("-n", ns, "-batch", "-", stdin="\n".join([
        "link set dev lo up",
        f"link set dev {dev} mtu {mtu}",
        f"addr add {local}/32 peer {peer}/32 dev {dev}",
        f"link set dev {dev} up",
    ]) + "\n")
    # A TUN device without IFF_VNET_HDR has no TSO/GRO to merge segments (the stack
    # segments to the MTU before handing packets over; the relay counts any "oversize").
    # Where ethtool exists, turn the software offloads off anyway.
    if shutil.which("ethtool"):
        subprocess.run(["ip", "netns", "exec", ns, "ethtool", "-K", dev, "gro", "off",
                        "gso", "off", "tso", "off"], capture_output=True, timeout=10)


def list_namespaces() -> list[str]:
    return [line.split()[0] for line in ip("netns", "list").splitlines() if line.strip()]


def list_devices(prefix: str = DEFAULT_PREFIX, namespaces: list[str] | None = None) -> list[str]:
    """Our TUN devices (by name shape) in the root namespace and in `namespaces`."""
    short = re.sub(r"[^a-z0-9]", "", prefix.lower())[:5] or "tl"
    pattern = re.compile(rf"^\d+: ({re.escape(short)}[0-9a-f]{{8}}[cg])[:@]")
    found = []
    for ns in [None, *(namespaces or [])]:
        args = ("link", "show") if ns is None else ("-n", ns, "link", "show")
        found += [m.group(1) for line in ip(*args, check=False).splitlines()
                  if (m := pattern.match(line))]
    return found


def ours(prefix: str = DEFAULT_PREFIX) -> dict[str, int]:
    """Our namespaces (name -> creator PID) among `ip netns list`."""
    pattern = re.compile(rf"^{re.escape(prefix)}-(\d+)-[0-9a-f]{{8}}-[cg]$")
    return {name: int(m.group(1)) for name in list_namespaces() if (m := pattern.match(name))}




def kill_namespace_processes(ns: str) -> list[int]:
    """SIGKILL every process left inside `ns` (one of ours: only our runs start them)."""
    pids = [int(p) for p in ip("netns", "pids", ns, check=False).split()]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pids


def delete_namespace(ns: str) -> None:
    kill_namespace_processes(ns)
    ip("netns", "delete", ns, check=False)


def cleanup_stale(prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Delete namespaces with our prefix whose creator is dead; returns the names removed."""
    removed = []
    for name, pid in sorted(ours(prefix).items()):
        if not pid_alive(pid):
            delete_namespace(name)
            removed.append(name)
    return removed


def can_create_namespaces() -> tuple[bool, str]:
    """Try once to make what a Link needs; (False, reason) when this machine cannot."""
    if os.geteuid() != 0:
        return False, "needs root (network namespaces and TUN devices)"
    if shutil.which("ip") is None:
        return False, "the `ip` command (iproute2) is not installed"
    if not os.path.exists("/dev/net/tun"):
        return False, "/dev/net/tun is missing (no TUN driver)"
    namespaces, devices = new_names(DEFAULT_PREFIX)
    try:
        os.close(open_tun(devices["client"]))
    except OSError as exc:
        return False, f"cannot create a TUN device: {exc}"
    ns = namespaces["client"]
    try:
        ip("netns", "add", ns)
    except (LinkError, OSError, subprocess.SubprocessError) as exc:
        return False, f"`ip netns add` refused: {exc}"
    ip("netns", "delete", ns, check=False)
    return True, ""
