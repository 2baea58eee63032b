"""Decayed usage on plain ledger rows: the half-life, running tasks, and rows out of range."""

from __future__ import annotations

import math

import pytest

from broker.scheduler.fairshare import UsageRow, decayed_usage

H = 3600.0


def test_one_gpu_for_one_half_life_ending_now() -> None:
    usage = decayed_usage([UsageRow("a", 0.0, H, 1.0)], now=H, half_life_s=H)
    assert usage["a"] == pytest.approx(H / math.log(2) / 2)


def test_use_one_half_life_older_counts_half() -> None:
    recent = decayed_usage([UsageRow("a", 0.0, 60.0, 2.0)], now=60.0, half_life_s=H)
    older = decayed_usage([UsageRow("a", 0.0, 60.0, 2.0)], now=60.0 + H, half_life_s=H)
    assert older["a"] == pytest.approx(recent["a"] / 2)


def test_a_running_task_counts_until_now() -> None:
    running = decayed_usage([UsageRow("a", 100.0, None, 0.5)], now=500.0, half_life_s=H)
    ended = decayed_usage([UsageRow("a", 100.0, 500.0, 0.5)], now=500.0, half_life_s=H)
    assert running == ended
    assert 0.5 * 400 * 0.9 < running["a"] < 0.5 * 400


def test_teams_add_up_separately_and_future_use_is_ignored() -> None:
    rows = [
        UsageRow("a", 0.0, 10.0, 1.0),
        UsageRow("a", 0.0, 10.0, 1.0),
        UsageRow("b", 0.0, 10.0, 1.0),
        UsageRow("b", 20.0, 30.0, 8.0),
        UsageRow("c", 5.0, 5.0, 1.0),
    ]
    usage = decayed_usage(rows, now=10.0, half_life_s=H)
    assert usage["a"] == pytest.approx(2 * usage["b"])
    assert "c" not in usage


def test_the_half_life_must_be_positive() -> None:
    with pytest.raises(ValueError, match="half_life_s"):
        decayed_usage([], now=0.0, half_life_s=0.0)
