"""A pool's settings travel as its kind's validated model, from the estate to the driver: no
dict re-parsed, no default written twice (broker/pools/settings.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.estates import batch_estate
from pydantic import ValidationError

from broker.domain import Pool
from broker.pools.base import Context
from broker.pools.lsf import LsfSettings
from broker.pools.pbs import PbsSettings
from broker.pools.registry import make_driver, settings_for
from broker.pools.settings import (
    SUBMIT_CONCURRENCY,
    BatchSettings,
    poll_interval_s,
    requeues_preempted,
    serves_remotely,
    settings_as,
    submit_concurrency,
)
from broker.pools.slurm import SlurmDriver, SlurmSettings


def test_the_estate_hands_the_driver_the_kinds_model_itself() -> None:
    estate = batch_estate("slurm", partition="gpu", poll_interval="30s", requeue="klique")
    pool = estate.pools["p"]
    assert isinstance(pool.settings, SlurmSettings)
    driver = make_driver(pool, Context(estate, Path("."), Path(__file__), None))
    assert isinstance(driver, SlurmDriver) and driver.settings is pool.settings
    assert (driver.interval_s, driver.settings.partition) == (30.0, "gpu")
    assert requeues_preempted(pool) and poll_interval_s(pool) == 30.0


def test_settings_for_builds_a_model_as_the_estate_would() -> None:
    pbs = settings_for("pbs", queue="workq", job_root="/jobs")
    assert isinstance(pbs, PbsSettings) and (pbs.queue, pbs.dialect) == ("workq", "pbspro")
    with pytest.raises(ValidationError, match="partition"):
        settings_for("lsf", partition="gpu")  # a Slurm setting on an LSF pool
    assert isinstance(settings_for("lsf"), LsfSettings)


def test_a_pool_of_another_kind_is_a_wiring_mistake_named_as_such() -> None:
    pool = Pool("q", "pbs", settings=settings_for("pbs"))
    assert settings_as(pool, BatchSettings) is pool.settings
    with pytest.raises(TypeError, match="PbsSettings settings where SlurmSettings"):
        settings_as(pool, SlurmSettings)


def test_a_pool_built_for_placement_alone_answers_with_the_defaults() -> None:
    pool = Pool("box", "host", slots=2)
    assert not serves_remotely(pool) and not requeues_preempted(pool)
    assert poll_interval_s(pool) is None  # the scheduler's own tick
    assert submit_concurrency(pool) == SUBMIT_CONCURRENCY
    remote = Pool("far", "host", settings=settings_for("host", agent="remote"))
    assert serves_remotely(remote)
