"""`klique template render`: the exact batch script a task would be submitted with, checked
(on a Kubernetes pool: the pod, as YAML)."""

from __future__ import annotations

import asyncio
import secrets
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from broker.domain import Estate, Task, TaskSpec, TaskState
from broker.errors import KliqueError, NotFound
from broker.pools.base import Context
from broker.pools.batch import BatchDriver
from broker.pools.kubernetes import KubernetesDriver
from broker.pools.registry import make_driver


@dataclass(frozen=True)
class Preview:
    pool: str
    script: str
    checks: list[str]
    ok: bool
    template: Path  # the file the script was rendered from (the site's, or a built-in one)


def sample_task(estate: Estate, resource: str, owner: str | None = None) -> Task:
    """A stand-in task for previews: id 0, the first mapped user, `python train.py`."""
    _known(estate, resource)
    spec = TaskSpec(command=("python", "train.py"), resource=resource, name="preview")
    return Task(
        id=0,
        spec=spec,
        owner=owner or _first_user(estate, resource),
        team=None,
        state=TaskState.QUEUED,
        created_at=time.time(),
        gpus=estate.resources[resource].profile.gpu_share,
    )


def _known(estate: Estate, resource: str) -> None:
    if resource not in estate.resources:
        known = ", ".join(estate.resources)
        raise NotFound(f"unknown compute resource {resource!r}; known: {known}")


def _first_user(estate: Estate, resource: str) -> str:
    for pool_name in estate.resources[resource].profile.pools:
        accounts = estate.pools[pool_name].user_map.accounts
        if accounts:
            return next(iter(accounts))
    return "preview"


def driver_for(estate: Estate, resource: str, pool: str | None) -> BatchDriver | KubernetesDriver:

    _known(estate, resource)
    order = estate.resources[resource].profile.pools
    candidates = [pool] if pool else list(order)
    for name in candidates:
        if name not in estate.pools:
            raise NotFound(f"unknown pool {name!r}; known: {', '.join(estate.pools)}")
        if estate.pools[name].queueing:
            context = Context(estate, Path("."), Path("klique-runner.pyz"), None)
            driver = make_driver(estate.pools[name], context)
            assert isinstance(driver, BatchDriver | KubernetesDriver)
            return driver
    raise KliqueError(
        f"compute resource {resource!r} has no batch pool (pools: "
        f"{', '.join(order)}); host pools run without a batch script"
    )


def render_preview(estate: Estate, task: Task, pool: str | None, check: bool) -> Preview:
    driver = driver_for(estate, task.resource, pool)
    if isinstance(driver, KubernetesDriver):
        return _pod_preview(driver, task)
    script = driver.render(task)
    template = driver.template(task.resource).path
    if not check:
        return Preview(driver.pool.name, script, [], True, template)
    checks, ok = _bash_n(script)
    if ok:
        more, ok = asyncio.run(_test_only(driver, task, script))
        checks += more
    return Preview(driver.pool.name, script, [f"template: {template}", *checks], ok, template)


def _pod_preview(driver: KubernetesDriver, task: Task) -> Preview:
    """A Kubernetes pool's pod as YAML (labelled with a stand-in installation id)."""
    driver._installation = driver._installation or "preview"  # noqa: SLF001 - no home here
    pod = yaml.safe_dump(driver.render(task), sort_keys=False)
    base = driver.base_template()
    return Preview(driver.pool.name, pod, [f"template: {base}"], True, base)


def _bash_n(script: str) -> tuple[list[str], bool]:
    done = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return [f"bash -n: {done.stderr.strip()}"], False
    return ["bash -n: ok"], True


async def _test_only(driver: BatchDriver, task: Task, script: str) -> tuple[list[str], bool]:
    """Ask the scheduler itself, as the task's account, where the pool offers that."""
    path = f"{driver.job_root.rstrip('/')}/klique-preview-{secrets.token_hex(6)}.sh"
    argv = driver.test_only_argv(path)
    if argv is None:
        return [f"{driver.kind}: the scheduler has no test-only submission; not checked"], True
    try:
        account = driver.account(task)
        await driver.transport.make_dir(driver.job_root, account=account)
        await driver.transport.write_file(path, script.encode(), account=account, mode=0o755)
        done = await driver.transport.run(argv, account=account, timeout=30)
        await driver.transport.remove(path, account=account)
    except KliqueError as exc:
        return [f"{argv[0]}: not checked, the pool is not reachable: {exc}"], True
    finally:
        await driver.close()
    words = (done.stderr + done.stdout).strip()
    return [f"{' '.join(argv[:2])}: {words or 'ok'}"], done.returncode == 0
