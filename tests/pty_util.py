"""Running a command at a pseudo-terminal and reading everything it drew."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import termios
from typing import Any


def run_at_terminal(cmd: list[str], columns: int = 80, lines: int = 40, timeout_s: float = 120, **popen: Any) -> tuple[int, str]:
    """Run ``cmd`` with a pseudo-terminal ``columns`` wide as its stdin, stdout and stderr (unless
    ``popen`` says otherwise); returns (exit code, what it wrote to the terminal)."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", lines, columns, 0, 0))
    streams = {"stdin": follower, "stdout": follower, "stderr": follower, **popen}
    proc = subprocess.Popen(cmd, **streams)
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # the other side closed: EIO on Linux
            break
        if not data:
            break
        chunks.append(data)
    rc = proc.wait(timeout=timeout_s)
    os.close(leader)
    return rc, b"".join(chunks).decode("utf-8", "replace")
