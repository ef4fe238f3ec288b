"""A job run beside the services (the step-0 eval beside a LoRA run's training) may finish while the supervisor
waits for the trainer; only a non-zero exit is a failure."""

from __future__ import annotations

import sys

import pytest

from launcher.supervisor import Service, ServiceFailed, Supervisor


def _job(name: str, code: int, one_shot: bool) -> Service:
    return Service(name, [sys.executable, "-c", f"raise SystemExit({code})"], one_shot=one_shot)


def _waiter() -> Service:
    return Service("waiter", [sys.executable, "-c", "import time; time.sleep(1.5)"])


def test_a_one_shot_job_that_finishes_is_not_a_failure(tmp_path):
    with Supervisor(tmp_path) as sup:
        sup.start(_job("eval", 0, one_shot=True))
        assert sup.wait_for(sup.start(_waiter()), timeout_s=30) == 0


@pytest.mark.parametrize(("code", "one_shot"), [(3, True), (0, False)])
def test_a_failed_job_or_an_exited_service_still_fails_the_wait(tmp_path, code, one_shot):
    with Supervisor(tmp_path) as sup:
        sup.start(_job("eval", code, one_shot=one_shot))
        with pytest.raises(ServiceFailed, match="eval exited"):
            sup.wait_for(sup.start(_waiter()), timeout_s=30)
