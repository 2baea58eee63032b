"""Environment builds and runner start-up: venv + pip against Klique cold, warm and reused.

Run: .venv/bin/python bench/envbuild.py. Needs PyPI. The last line printed is one JSON object.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from inside_job import zipapp  # noqa: E402

PACKAGES = ["numpy", "pandas", "requests", "pyyaml", "tqdm"]
# The system's python3, as a batch script on a compute node would start it.
SYSTEM_PYTHON = "/usr/bin/python3"
PYTHON = SYSTEM_PYTHON if os.path.exists(SYSTEM_PYTHON) else os.path.realpath(sys.executable)
UV = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
REUSE_RUNS = 15


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.pop("UV_CACHE_DIR", None)
    return env


def baseline(scratch: Path) -> float:
    """python -m venv + pip install (pip byte-compiles as it installs), no download cache."""
    env_dir = scratch / "baseline-venv"
    started = time.perf_counter()
    subprocess.run([PYTHON, "-m", "venv", str(env_dir)], check=True, env=clean_env())
    pip = [str(env_dir / "bin" / "pip"), "install", "--quiet", "--no-cache-dir"]
    subprocess.run([*pip, "--disable-pip-version-check", *PACKAGES], check=True, env=clean_env())
    return time.perf_counter() - started


def make_job(
    scratch: Path, name: str, envs: str, packages: str, compile_at: str = "background"
) -> Path:
    """A job whose environments live in scratch/envs-<envs>, packages in scratch/pkg-<packages>."""
    job = scratch / name
    job.mkdir()
    task = {
        "version": 1,
        "id": name,
        "command": ["true"],
        "code": None,
        "requirements": PACKAGES,
        "cache_dir": str(scratch / f"envs-{envs}"),
        "package_cache": str(scratch / f"pkg-{packages}"),
        "uv": UV,
        "compile": compile_at,
    }
    (job / "task.json").write_text(json.dumps(task))
    zipapp.build(job / "klique-runner.pyz")
    return job


def run_job(job: Path) -> tuple[float, dict]:
    """Wall time of `python3 klique-runner.pyz JOB` and its exit.json."""
    started = time.perf_counter()
    subprocess.run(
        [PYTHON, str(job / "klique-runner.pyz"), str(job)],
        check=True,
        env=clean_env(),
        cwd=str(job),
    )
    wall = time.perf_counter() - started
    return wall, json.loads((job / "exit.json").read_text())


def wait_for_background_compiles(scratch: Path, limit_s: float = 300) -> float:
    """Seconds until no byte-compile of an environment under scratch is still running."""
    started = time.perf_counter()
    while time.perf_counter() - started < limit_s:
        busy = False
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                text = cmdline.read_bytes()
            except OSError:
                continue
            busy = busy or (b"compileall" in text and str(scratch).encode() in text)
        if not busy:
            break
        time.sleep(0.1)
    return time.perf_counter() - started


def task_alone(runs: int) -> float:
    """The trivial task's own wall time, started directly."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(["true"], check=True)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def build(
    scratch: Path, name: str, envs: str, packages: str, compile_at: str = "background"
) -> float:
    wall, exit_file = run_job(make_job(scratch, name, envs, packages, compile_at))
    assert exit_file["environment"]["reused"] is False, exit_file
    wait_for_background_compiles(scratch)  # the next measurement runs on a quiet machine
    return wall


def measure(scratch: Path) -> dict:
    base = baseline(scratch)
    print(f"baseline  venv + pip, no cache:              {base:7.2f} s", flush=True)
    cold = build(scratch, "cold", "a", "a")
    print(f"klique    cold (empty uv cache):             {cold:7.2f} s", flush=True)
    warm = build(scratch, "warm", "b", "a")
    print(f"klique    warm (new env, uv cache filled):   {warm:7.2f} s", flush=True)
    compiled = build(scratch, "compiled", "c", "c", "build")
    print(f"klique    cold, byte-compiled before use:    {compiled:7.2f} s", flush=True)
    reuse_times = []
    for i in range(REUSE_RUNS):
        wall, exit_file = run_job(make_job(scratch, f"reuse{i}", "a", "a"))
        assert exit_file["environment"]["reused"] is True, exit_file
        reuse_times.append(wall)
    reuse = statistics.median(reuse_times)
    own = task_alone(REUSE_RUNS)
    print(f"klique    reuse, whole runner (median):      {reuse * 1000:7.1f} ms", flush=True)
    print(f"task      `true` alone (median):             {own * 1000:7.1f} ms", flush=True)
    print(f"runner    overhead on reuse:                 {(reuse - own) * 1000:7.1f} ms")
    return {
        "baseline_s": round(base, 3),
        "cold_s": round(cold, 3),
        "warm_s": round(warm, 3),
        "reuse_s": round(reuse, 4),
        "runner_overhead_s": round(reuse - own, 4),
        "cold_speedup": round(base / cold, 1),
        "cold_compiled_s": round(compiled, 3),
    }


def main() -> None:
    if UV is None:
        sys.exit("bench/envbuild.py needs uv (pip install uv)")
    scratch = Path(tempfile.mkdtemp(prefix="klique-bench-"))
    try:
        print(f"packages: {' '.join(PACKAGES)}; python {PYTHON}; uv {UV}", flush=True)
        figures = measure(scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
