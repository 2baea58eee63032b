"""Submit replies lost after the scheduler queued the job, on the PBS Professional, Torque and
LSF simulators (sim_scenarios.py; bench/chaos.py runs the same): qsub and bsub fail with the
communication error the real commands print, the job exists all the same. The simulator's own
job table is the judge: one job per task, none submitted twice, none lost, every task ended
as its command says."""

from __future__ import annotations

from typing import Any

import pytest
from sim_scenarios import sim_lost_replies

pytestmark = [pytest.mark.chaos]


@pytest.mark.parametrize("scheduler", ["pbspro", "torque", "lsf"])
def test_lost_submit_replies_double_and_lose_no_job(scheduler: str, test_users: Any) -> None:
    outcome = sim_lost_replies(scheduler)
    assert outcome.clean, outcome.explain()
