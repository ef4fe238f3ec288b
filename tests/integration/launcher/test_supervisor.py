"""The local supervisor with real child processes: health wait, crash detection, clean stop."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.supervisor import Service, ServiceFailed, Supervisor
from shared.redis_server import free_port

REPO = Path(__file__).resolve().parents[3]


def http_service(tmp_path, name="web") -> Service:
    # `python -m http.server` answers GET /health with 200 once a file named "health" exists in its folder.
    (tmp_path / "health").write_text("ok")
    port = free_port()
    return Service(
        name,
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(tmp_path)],
        health_url=f"http://127.0.0.1:{port}/health",
        startup_timeout_s=30,
    )


def test_start_wait_and_stop(tmp_path):
    with Supervisor(tmp_path / "logs") as sup:
        web = sup.start(http_service(tmp_path))
        assert web.proc.poll() is None
        sup.check()
        job = sup.start(Service("job", [sys.executable, "-c", "print('hello from job')"]))
        assert sup.wait_for(job, timeout_s=30) == 0
        assert "hello from job" in job.tail()
    assert web.proc.poll() is not None  # stopped on exit


def test_crash_is_reported_with_the_log_tail(tmp_path):
    with Supervisor(tmp_path / "logs") as sup:
        crash = [sys.executable, "-c", "import sys; print('index missing'); sys.exit(3)"]
        with pytest.raises(ServiceFailed, match=r"(?s)exited with code 3.*index missing"):
            sup.start(Service("broken", crash, health_url=f"http://127.0.0.1:{free_port()}/health"))


def test_a_dying_neighbour_stops_the_wait(tmp_path):
    with Supervisor(tmp_path / "logs") as sup:
        sup.start(Service("short", [sys.executable, "-c", "import time; time.sleep(0.5)"]))
        long_job = sup.start(Service("long", [sys.executable, "-c", "import time; time.sleep(60)"]))
        with pytest.raises(ServiceFailed, match="short exited"):
            sup.wait_for(long_job, timeout_s=30)
    assert long_job.proc.poll() is not None


def test_unhealthy_service_times_out(tmp_path):
    with Supervisor(tmp_path / "logs") as sup:
        sleeper = Service(
            "mute",
            [sys.executable, "-c", "import time; time.sleep(60)"],
            health_url=f"http://127.0.0.1:{free_port()}/health",
            startup_timeout_s=1.5,
        )
        with pytest.raises(ServiceFailed, match="not healthy within"):
            sup.start(sleeper)


SLOW_TO_STOP = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: (time.sleep(3), sys.exit(0)))  # like a trainer writing its checkpoint
print('ready', flush=True)
time.sleep(60)
"""


def test_each_service_gets_its_own_grace_and_the_wait_is_logged(tmp_path, caplog):
    with Supervisor(tmp_path / "logs", grace_s=1.0) as sup:
        sup.WAIT_LOG_S = 1.0
        patient = sup.start(Service("trainer", [sys.executable, "-c", SLOW_TO_STOP], stop_grace_s=30))
        hasty = sup.start(Service("other", [sys.executable, "-c", SLOW_TO_STOP]))
        deadline = time.monotonic() + 30
        while "ready" not in patient.tail() or "ready" not in hasty.tail():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        with caplog.at_level(logging.INFO, logger="launcher.supervisor"):
            sup.stop_all()
    assert patient.proc.returncode == 0  # given the time it needed, not killed
    assert hasty.proc.returncode == -signal.SIGKILL  # the default grace (1 s) is shorter than its 3 s
    waits = [r for r in caplog.records if r.getMessage() == "waiting for service to stop"]
    assert waits and all(r.service == "trainer" for r in waits)


SUPERVISOR = """
import sys, time
from launcher.supervisor import Service, Supervisor
with Supervisor(sys.argv[1]) as sup:
    for name in ("web", "trainer"):
        print(sup.start(Service(name, [sys.executable, "-c", "import time; time.sleep(600)"])).proc.pid, flush=True)
    time.sleep(600)
"""


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for a parent that does not reap it counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal is Linux's")
@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGKILL], ids=["SIGHUP", "SIGKILL"])
def test_no_service_outlives_its_supervisor(tmp_path, sig):
    """The terminal closed (SIGHUP) or the supervisor killed outright: its services go too, within seconds."""
    sup = subprocess.Popen(
        [sys.executable, "-c", SUPERVISOR, str(tmp_path / "logs")], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    children: list[int] = []
    try:
        children += [int(sup.stdout.readline()) for _ in range(2)]
        assert all(_alive(pid) for pid in children)
        sup.send_signal(sig)
        sup.wait(30)
        deadline = time.monotonic() + 5
        while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [pid for pid in children if _alive(pid)], f"left running after {sig.name}"
    finally:
        sup.kill()
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
