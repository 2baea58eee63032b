"""The environment cache with real locks: one build per key, LRU eviction, partial builds."""

from __future__ import annotations

import os
import threading

from inside_job import envbuild, envcache
from inside_job.locks import FileLock


def _builder(calls, size=100):
    def build(path):
        calls.append(path)
        tmp = path + ".tmp-test"
        os.makedirs(tmp)
        with open(os.path.join(tmp, "blob"), "wb") as f:
            f.write(b"x" * size)
        info = {"bytes": size, "built": 0, "tool": "test"}
        envbuild._write_marker(tmp, info)
        os.rename(tmp, path)
        return info

    return build


def test_a_key_is_built_once_and_then_reused(tmp_path):
    calls: list[str] = []
    first = envbuild.acquire(str(tmp_path), "k1", _builder(calls))
    second = envbuild.acquire(str(tmp_path), "k1", _builder(calls))
    assert (first.built, second.built, len(calls)) == (True, False, 1)
    assert second.report()["reused"] is True
    first.lock.close()
    second.lock.close()


def test_racers_for_one_key_build_once_and_none_waits_for_the_others_tasks(tmp_path):
    calls: list[str] = []
    handles = []
    gate = threading.Barrier(4)

    def take():
        gate.wait()
        handles.append(envbuild.acquire(str(tmp_path), "k", _builder(calls)))

    threads = [threading.Thread(target=take, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    # every racer got its environment while the others still hold theirs (tasks running)
    assert len(calls) == 1 and sorted(h.built for h in handles) == [False, False, False, True]
    for h in handles:
        h.lock.close()


def test_eviction_removes_the_least_recently_used_first(tmp_path):
    envs = str(tmp_path)
    for key, used in (("old", 1000), ("mid", 2000), ("new", 3000)):
        envbuild.acquire(envs, key, _builder([])).lock.close()
        os.utime(os.path.join(envs, key, envbuild.MARKER), (used, used))
    assert envcache.evict(envs, budget=150) == ["old", "mid"]
    assert sorted(n for n in os.listdir(envs) if not n.endswith(".lock")) == ["new"]


def test_eviction_skips_an_environment_in_use(tmp_path):
    envs = str(tmp_path)
    held = envbuild.acquire(envs, "held", _builder([]))
    envbuild.acquire(envs, "free", _builder([])).lock.close()
    assert envcache.evict(envs, budget=0) == ["free"]
    assert os.path.isdir(os.path.join(envs, "held"))
    held.lock.close()


def test_a_partial_build_is_cleared_before_the_next(tmp_path):
    path = str(tmp_path / "k")
    os.makedirs(path + ".tmp-999/bin")
    os.makedirs(path)  # a folder without the ready marker
    with FileLock(path + ".build.lock"):
        envcache.remove_partial(path)
    assert os.listdir(tmp_path) == ["k.build.lock"]
