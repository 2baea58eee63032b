"""Shared by the benchmarks: a real Klique server in a scratch home, and medians."""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def klique_server(
    estate_text: str | None = None, prepare: Callable[[Path], None] | None = None
) -> Iterator[tuple[httpx.Client, Path]]:
    """A server on loopback with its own home (first filled by `prepare(home)`, if given);
    yields an authenticated API client."""
    with tempfile.TemporaryDirectory(prefix="klique-bench-") as scratch:
        home = Path(scratch) / "home"
        home.mkdir()
        if prepare is not None:
            prepare(home)
        args = [sys.executable, "-m", "broker", "server", "--port", str(port := free_port())]
        args += ["--routes-port", str(free_port())]
        # The bench's clusters run their nodes on this machine: loopback reaches them, said so.
        args += ["--public-url", f"http://127.0.0.1:{port}"]
        if estate_text is not None:
            (estate := Path(scratch) / "estate.yaml").write_text(estate_text)
            args += ["--estate", str(estate)]
        env = {**os.environ, "KLIQUE_HOME": str(home)}
        with (home / "server.log").open("ab") as log:
            server = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        (home / "bench-server.pid").write_text(str(server.pid))  # for cpu_seconds()
        url = f"http://127.0.0.1:{port}/api/v1"
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(url + "/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit((home / "server.log").read_text())
                time.sleep(0.1)
            token = (home / "admin.token").read_text().strip()
            with httpx.Client(
                base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60
            ) as api:
                yield api, home
        finally:
            server.terminate()
            server.wait(30)


def slurm_estate(job_root: Path, account: str, **pool_settings: object) -> str:
    """One compute resource on the `debug` partition of the cluster of scripts/slurm-up,
    submitted as `account` for the admin user; `pool_settings` are added to the pool."""
    extra = "".join(f"    {key}: {value}\n" for key, value in pool_settings.items())
    return f"""
resources:
  cpu:
    profile: {{cpus: 1, memory: 100M, walltime: 10m, pools: [slurm]}}
pools:
  slurm:
    kind: slurm
    partition: debug
    job_root: {job_root}
    python: /usr/bin/python3
{extra}    user_map: {{admin: {account}}}
"""


def median(values: list[float]) -> float:
    return round(statistics.median(values), 4)


def cpu_seconds(pid: int, children: bool = False) -> float:
    """CPU time (user and system) a process has used so far; with `children`, that of its
    children it has waited for instead."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    first = 13 if children else 11  # utime stime, then cutime cstime (proc(5))
    return (int(fields[first]) + int(fields[first + 1])) / os.sysconf("SC_CLK_TCK")


def last_line(result: dict[str, object]) -> None:
    print(json.dumps(result))
