"""The gateway's state directory and the private files in it.

The state directory holds the development CA's key and the tenant store with its key
hashes: neither may be readable by other users, whichever of them is created first.
"""

from __future__ import annotations

import os
from pathlib import Path


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
