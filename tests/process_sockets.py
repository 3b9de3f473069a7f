"""A process's TCP connections to one port, from /proc (Linux): for tests and benchmarks that
check how a process uses a server's connections (e.g. serve's to the Kafka broker)."""

from __future__ import annotations

import os
from pathlib import Path

TCP_ESTABLISHED = "01"


def connections_to(pid: int, port: int) -> frozenset[int]:
    """The socket inodes of `pid`'s established TCP connections (IPv4 and IPv6) to `port`: an
    inode names one connection for its whole life, so a new inode is a new connection."""
    owned = set()
    fds = Path(f"/proc/{pid}/fd")
    for fd in fds.iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            owned.add(int(target[len("socket:["):-1]))
    found = set()
    for table in ("tcp", "tcp6"):
        path = Path(f"/proc/{pid}/net/{table}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            remote_port, state, inode = int(fields[2].split(":")[1], 16), fields[3], int(fields[9])
            if state == TCP_ESTABLISHED and inode in owned and remote_port == port:
                found.add(inode)
    return frozenset(found)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds `pid` has used so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
