"""Simulated hosts for integration tests: two Linux network namespaces joined by one veth pair.

``two_hosts(tag)`` makes hosts A and B (namespaces ``coda-<tag>-a``/``-b``) with ``10.77.0.1/24`` and
``10.77.0.2/24`` on the two ends of a veth pair and loopback up in each, and removes them again on exit, also
when the test failed; where they cannot be made (not root, no ``ip``, no permission) the test is skipped and
the message says why. A process runs on a host with ``host.wrap(...)`` in front of its command (``ip netns
exec NS env K=V``: both exec, so the process's pid is the command's own). The test itself reaches what runs
inside a host through ``host.call(fn)``: ``fn`` runs on a thread that joined the host's namespace (setns), so
every socket it opens is that host's and the traffic stays between the namespaces' own addresses.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

import pytest

SUBNET = "10.77.0"
CLONE_NEWNET = 0x40000000  # <sched.h>: setns into a network namespace
DENIED = ("Operation not permitted", "Permission denied", "not supported", "Cannot create namespace")
T = TypeVar("T")


@dataclass
class Host:
    """One simulated host: a network namespace with ``addr`` on its end ``ifname`` of the veth pair."""

    name: str
    ifname: str
    addr: str
    _thread: ThreadPoolExecutor | None = field(default=None, repr=False)

    def wrap(self, **env: str) -> list[str]:
        """The prefix that runs a command on this host, with ``env`` set on top of the caller's environment."""
        return ["ip", "netns", "exec", self.name, "env", *(f"{k}={v}" for k, v in env.items())]

    def url(self, port: int) -> str:
        return f"http://{self.addr}:{port}"

    def call(self, fn: Callable[..., T], *args, timeout_s: float = 120) -> T:
        """``fn(*args)`` on this host's network (one thread per host, inside its namespace)."""
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, self.name, initializer=_enter, initargs=(self.name,))
        return self._thread.submit(fn, *args).result(timeout_s)

    def close(self) -> None:
        if self._thread is not None:
            self._thread.shutdown(wait=False, cancel_futures=True)


def _enter(name: str) -> None:
    """Move the calling thread into namespace ``name`` (the rest of the process stays where it is)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into {name}: {os.strerror(err)}")
    finally:
        os.close(fd)


def unavailable() -> str | None:
    """Why namespaces cannot be made here, or None."""
    if not sys.platform.startswith("linux"):
        return "simulated hosts need Linux network namespaces"
    if os.geteuid() != 0:
        return f"simulated hosts need root to create network namespaces (euid {os.geteuid()})"
    if shutil.which("ip") is None:
        return "simulated hosts need the `ip` command (iproute2) to create network namespaces"
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        message = f"`ip {' '.join(args)}` failed: {done.stderr.strip()}"
        if any(s in done.stderr for s in DENIED):
            pytest.skip(f"cannot make network namespaces here: {message}")
        raise RuntimeError(message)
    return done


@contextlib.contextmanager
def two_hosts(tag: str) -> Iterator[tuple[Host, Host]]:
    """Hosts A (``10.77.0.1``) and B (``10.77.0.2``), removed on exit; ``tag`` makes the names unique (the
    pid: at most 7 digits, so that an interface name stays within 15 characters)."""
    why = unavailable()
    if why:
        pytest.skip(why)
    hosts = (Host(f"coda-{tag}-a", f"cv{tag}a", f"{SUBNET}.1"), Host(f"coda-{tag}-b", f"cv{tag}b", f"{SUBNET}.2"))
    try:
        for host in hosts:
            _ip("netns", "add", host.name)
        _ip("link", "add", hosts[0].ifname, "type", "veth", "peer", "name", hosts[1].ifname)
        for host in hosts:
            _ip("link", "set", host.ifname, "netns", host.name)
            _ip("-n", host.name, "addr", "add", f"{host.addr}/24", "dev", host.ifname)
            _ip("-n", host.name, "link", "set", "lo", "up")
            _ip("-n", host.name, "link", "set", host.ifname, "up")
        yield hosts
    finally:
        for host in hosts:
            host.close()
            _remove(host)


def _remove(host: Host) -> None:
    """Delete ``host``'s namespace (its veth end goes with it, and the peer with that), after killing what
    still runs in it: the test's own processes, left behind by a failure (a namespace lives while they do)."""
    listed = _ip("netns", "pids", host.name, check=False)
    for pid in listed.stdout.split() if listed.returncode == 0 else []:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    _ip("netns", "del", host.name, check=False)
    # A veth pair made but not yet moved into its namespace is still in ours.
    if _ip("link", "show", host.ifname, check=False).returncode == 0:
        _ip("link", "del", host.ifname, check=False)
