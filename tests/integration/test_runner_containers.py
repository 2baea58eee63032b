"""Every container runtime, run for real: the runner zipapp starts the task in Charliecloud (real
ch-run) or through the Apptainer, SingularityCE, enroot 3 and 4 and Pyxis simulators on PATH
(tests/fakes/README.md), which run it in the image's root file system with ch-run.

Each scenario runs on each runtime: a run, a failure, a cancel, an image with an entrypoint, a
conda-style image PATH, hostile environment values, the GPU grant 2,3 and an image that does
not exist."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import wait_for
from helpers.container_images import (
    CONDA_ENV,
    FAKES,
    add_conda,
    add_python,
    busybox_rootfs,
    charliecloud_image,
    publish,
)
from helpers.runner import console, make_job, read_json

from inside_job import container, imageref, zipapp

_MISSING = [p for p in ("ch-run", "busybox", "mksquashfs", "unsquashfs") if not shutil.which(p)]
if _MISSING and os.environ.get("KLIQUE_REQUIRE_SERVICES") == "1":
    raise RuntimeError(f"{', '.join(_MISSING)} missing: run scripts/apt-deps")
pytestmark = pytest.mark.skipif(bool(_MISSING), reason=f"needs {', '.join(_MISSING)}")

PYTHON_IN_IMAGE = "python3"
# {canary} stands for a file that a value evaluated by a shell would create.
HOSTILE = [
    'it\'s "quoted"',
    "$(touch {canary})",
    "`touch {canary}`",
    "line one\nline two\n",
    "$HOME and ${PATH}",
    "'single'",
    '"double"',
    "\\\\ \t tab \\",
    "trailing space  ",
    "",
    "A=B\nLD_PRELOAD=/evil.so",
    "ünïcødé ✓",
]


@dataclass
class Runtime:
    """One way to run a container: the runtime, its settings, and the images it is given."""

    id: str
    runtime: str
    settings: dict[str, str] = field(default_factory=dict)
    images: dict[str, str] = field(default_factory=dict)  # plain, entry, conda, python, missing


RUNTIMES = [
    Runtime("charliecloud", "charliecloud"),
    Runtime("apptainer-1.3", "apptainer", {"KLIQUE_SIM_APPTAINER_VERSION": "1.3.4"}),
    Runtime("singularity-ce-3.9", "singularity", {"KLIQUE_SIM_SINGULARITY_VERSION": "3.9.9"}),
    Runtime("enroot-3.5", "enroot", {"KLIQUE_SIM_ENROOT_VERSION": "3.5.0"}),
    Runtime("enroot-4.1", "enroot", {"KLIQUE_SIM_ENROOT_VERSION": "4.1.2"}),
    Runtime("pyxis", "pyxis", {"KLIQUE_SIM_ENROOT_VERSION": "3.5.0"}),
]


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The images: Charliecloud directories and the simulators' registry."""
    root = tmp_path_factory.mktemp("images")
    plain = busybox_rootfs(root / "plain")
    conda = busybox_rootfs(root / "conda")
    add_conda(conda)
    local = {
        "plain": str(charliecloud_image(plain, [])),
        "entry": str(plain),  # Charliecloud images have no entrypoint: ch-run runs the command
        "conda": str(charliecloud_image(conda, CONDA_ENV)),
        "missing": str(root / "missing-image"),
    }
    registry = root / "registry"
    path = [f"PATH={container.DEFAULT_PATH}"]
    refs: dict[str, dict[str, str]] = {}
    for flavour in ("", "py-"):
        if flavour:  # Pyxis starts the runner inside the image: it needs python
            add_python(plain)
            add_python(conda)
        refs[flavour] = {
            "plain": publish(registry, f"klique/{flavour}plain", "1", plain, Env=path),
            "entry": publish(
                registry,
                f"klique/{flavour}entry",
                "1",
                plain,
                Env=path,
                Entrypoint=["/bin/echo", "entrypoint:"],
            ),
            "conda": publish(registry, f"klique/{flavour}conda", "1", conda, Env=CONDA_ENV),
            "missing": "registry.example.org/klique/missing:1",
        }
    return {"registry": registry, "refs": refs, "local": local}


@pytest.fixture(params=RUNTIMES, ids=lambda r: r.id)
def rt(request: pytest.FixtureRequest, library: dict[str, object]) -> Runtime:
    runtime: Runtime = request.param
    refs: dict[str, dict[str, str]] = library["refs"]  # type: ignore[assignment]
    local: dict[str, str] = library["local"]  # type: ignore[assignment]
    runtime.images = {"charliecloud": local, "pyxis": refs["py-"]}.get(runtime.runtime, refs[""])
    runtime.settings = dict(runtime.settings, KLIQUE_SIM_REGISTRY=str(library["registry"]))
    return runtime


@pytest.fixture
def workdir() -> Path:
    """Job folders outside /tmp: ch-run shares the host's /tmp, so Pyxis's same-path bind of
    the job folder cannot go below it."""
    path = Path(tempfile.mkdtemp(prefix="klique-ct-", dir="/var/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _environ(rt: Runtime, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KLIQUE_", "PYTHONPATH"))}
    folders = [FAKES / "apptainer", FAKES / "enroot", FAKES / "pyxis"]
    env["PATH"] = ":".join(str(f) for f in folders) + ":" + env.get("PATH", "/usr/bin:/bin")
    env.update(rt.settings)
    env.update(extra)
    return env


def _job(
    rt: Runtime,
    root: Path,
    command: list[str],
    image: str = "plain",
    name: str = "job",
    **task: object,
) -> Path:
    spec: dict[str, object] = {
        "command": command,
        "image": rt.images[image],
        "runtime": rt.runtime,
        "container_scratch": str(root / "scratch"),
    }
    if rt.runtime == "pyxis":
        spec["scheduler"] = "slurm"
    spec.update(task)
    job = make_job(root, name, **spec)
    zipapp.build(job / "klique-runner.pyz")
    return job


def _argv(rt: Runtime, job: Path) -> list[str]:
    runner = [str(job / "klique-runner.pyz"), str(job)]
    if rt.runtime != "pyxis":
        return ["/usr/bin/python3", *runner]
    spec = read_json(job, "task.json")
    image = imageref.for_runtime(spec["image"], "pyxis")  # as the Slurm template writes it
    return [*container.pyxis_srun_argv(image, str(job)), PYTHON_IN_IMAGE, *runner]


def run(rt: Runtime, job: Path, **extra: str) -> subprocess.CompletedProcess:
    env = _environ(rt, **({"KLIQUE_CONTAINER": "pyxis"} if rt.runtime == "pyxis" else {}), **extra)
    return subprocess.run(
        _argv(rt, job), env=env, capture_output=True, text=True, timeout=120, check=False
    )


def start(rt: Runtime, job: Path, **extra: str) -> subprocess.Popen:
    env = _environ(rt, **({"KLIQUE_CONTAINER": "pyxis"} if rt.runtime == "pyxis" else {}), **extra)
    return subprocess.Popen(
        _argv(rt, job), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _inner_job(rt: Runtime, job: Path) -> str:
    return str(job) if rt.runtime == "pyxis" else container.JOB_MOUNT


def test_a_task_runs_in_its_image(rt: Runtime, workdir: Path) -> None:
    job = _job(rt, workdir, ["/bin/sh", "-c", 'echo "hello from $KLIQUE_TASK_ID"; pwd'])
    result = run(rt, job)
    assert result.returncode == 0, (result.stderr, console(job))
    assert console(job).splitlines()[-2:] == ["hello from 7", _inner_job(rt, job)]
    assert read_json(job, "exit.json")["outcome"] == "completed"


def test_a_failing_task_fails_with_its_code(rt: Runtime, workdir: Path) -> None:
    job = _job(rt, workdir, ["/bin/sh", "-c", "echo failing; exit 3"])
    result = run(rt, job)
    assert result.returncode == 3, (result.stderr, console(job))
    exit_file = read_json(job, "exit.json")
    assert (exit_file["outcome"], exit_file["exit_code"]) == ("failed", 3)


def test_a_cancelled_task_ends_signalled_and_leaves_nothing_behind(
    rt: Runtime, workdir: Path
) -> None:
    job = _job(rt, workdir, ["/bin/sh", "-c", "echo ready; exec sleep 600"])
    runner = start(rt, job)
    wait_for(lambda: "ready" in console(job), timeout=60, what="the task to start")
    runner.send_signal(signal.SIGTERM)
    runner.wait(60)
    exit_file = read_json(job, "exit.json")
    assert exit_file["outcome"] == "signalled" and exit_file["signal"] == signal.SIGTERM
    scratch = workdir / "scratch"
    left = [p for p in scratch.rglob("run-*")] if scratch.exists() else []
    assert left == [], left


def test_the_images_entrypoint_is_not_run(rt: Runtime, workdir: Path) -> None:
    job = _job(rt, workdir, ["/bin/sh", "-c", "echo ran as asked"], image="entry")
    result = run(rt, job)
    assert result.returncode == 0, (result.stderr, console(job))
    assert console(job) == "ran as asked\n"


def test_the_images_path_and_libraries_are_kept_under_the_tasks_env(
    rt: Runtime, workdir: Path
) -> None:
    job = _job(rt, workdir, ["conda-tool"], image="conda", env={"MINE": "on top"})
    result = run(rt, job)
    assert result.returncode == 0, (result.stderr, console(job))
    line = console(job).splitlines()[-1]
    assert line.startswith("conda-tool PATH=/opt/conda/bin:"), line
    assert " LD=/opt/conda/lib" in line and line.endswith("MINE=on top")


def test_hostile_environment_values_arrive_byte_for_byte(rt: Runtime, workdir: Path) -> None:
    canary = workdir / "pwned"
    values = [v.replace("{canary}", str(canary)) for v in HOSTILE]
    env = {f"HOSTILE_{i}": v for i, v in enumerate(values)}
    names = " ".join(f'"${name}"' for name in env)
    job = _job(
        rt, workdir, ["/bin/sh", "-c", f'printf "%s\\0" {names} > "$KLIQUE_JOB_DIR/seen"'], env=env
    )
    result = run(rt, job)
    assert result.returncode == 0, (result.stderr, console(job))
    seen = (job / "seen").read_bytes().split(b"\0")[:-1]
    assert [s.decode() for s in seen] == values
    assert not canary.exists()


def test_the_grant_2_3_is_seen_as_exactly_two_gpus(rt: Runtime, workdir: Path) -> None:
    host_claims = {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "utility"}
    if rt.runtime == "pyxis":  # Slurm without a device cgroup gives the host's numbers
        job = _job(rt, workdir, ["gpu-probe"], gpus=None)
        result = run(rt, job, SLURM_JOB_GPUS="2,3", CUDA_VISIBLE_DEVICES="2,3", **host_claims)
    elif rt.runtime == "charliecloud":  # the host's /dev, with four fake device nodes
        devices = workdir / "job" / "dev"
        devices.mkdir(parents=True)
        for n in range(4):
            (devices / f"nvidia{n}").touch()
        job = _job(
            rt,
            workdir,
            ["gpu-probe"],
            gpus=[2, 3],
            env={"KLIQUE_SIM_DEV": f"{container.JOB_MOUNT}/dev"},
        )
        result = run(rt, job, **host_claims)
    else:
        job = _job(rt, workdir, ["gpu-probe"], gpus=[2, 3])
        result = run(rt, job, **host_claims)
    assert result.returncode == 0, (result.stderr, console(job))
    assert console(job).splitlines()[-1] == "gpus=2,3"


def test_an_image_that_does_not_exist_fails_saying_so(rt: Runtime, workdir: Path) -> None:
    job = _job(rt, workdir, ["/bin/true"], image="missing")
    result = run(rt, job)
    if rt.runtime == "pyxis":  # the runner never starts: srun says why in the job's output
        assert result.returncode != 0
        assert "pyxis: failed to import docker image" in result.stderr
        return
    exit_file = read_json(job, "exit.json")
    assert exit_file["outcome"] == "setup_failed", exit_file
    assert "missing" in exit_file["reason"], exit_file
    words = {
        "charliecloud": "does not exist on this node",
        "apptainer": "requested access to the resource is denied",
        "singularity": "requested access to the resource is denied",
        "enroot": "404 Not Found",
    }[rt.runtime]
    assert words in exit_file["reason"], exit_file


@pytest.mark.parametrize("version", ["3.5.0"])
def test_what_a_killed_runner_left_is_removed_by_the_next_run(
    library: dict[str, object], workdir: Path, version: str
) -> None:
    rt = Runtime("enroot", "enroot", {"KLIQUE_SIM_ENROOT_VERSION": version})
    refs: dict[str, dict[str, str]] = library["refs"]  # type: ignore[assignment]
    rt.images = refs[""]
    rt.settings["KLIQUE_SIM_REGISTRY"] = str(library["registry"])
    first = _job(rt, workdir / "a", ["/bin/sh", "-c", "echo ready; exec sleep 600"])
    runner = start(rt, first)
    wait_for(lambda: "ready" in console(first), timeout=60, what="the task to start")
    task_group = read_json(first, "status.json")["pid"]
    runner.kill()  # SIGKILL: no cleanup runs; the scheduler then ends the job's processes
    runner.wait(30)
    os.killpg(task_group, signal.SIGKILL)
    scratch = workdir / "a" / "scratch" / pwd.getpwuid(os.getuid()).pw_name / "enroot"
    left = list(scratch.glob("run-*"))
    assert any(p.is_dir() and (p / "data" / "klique-7").is_dir() for p in left), left

    second = _job(rt, workdir / "a", ["/bin/true"], name="job2")
    assert run(rt, second).returncode == 0, console(second)
    assert "left by an earlier run that was killed" in console(second)
    assert list(scratch.glob("run-*")) == []


@pytest.mark.parametrize("keep", [False, True], ids=["default", "container_home-account"])
def test_apptainer_keeps_the_accounts_home_out_unless_the_pool_says(
    rt: Runtime, workdir: Path, keep: bool
) -> None:
    """Apptainer mounts the account's home by default, and Python then imports ~/.local's
    packages into the task: Klique runs it with --no-home unless the pool's `container_home`
    is `account`."""
    if rt.runtime not in ("apptainer", "singularity"):
        pytest.skip("Apptainer and SingularityCE only")
    home = Path(pwd.getpwuid(os.getuid()).pw_dir)
    probe = Path(tempfile.mkstemp(prefix=".klique-home-probe-", dir=home)[1])
    try:
        check = f'if [ -e "{probe}" ]; then echo home-mounted; else echo home-absent; fi'
        setting = {"container_home": "account"} if keep else {}
        job = _job(rt, workdir, ["/bin/sh", "-c", check], **setting)
        result = run(rt, job)
        assert result.returncode == 0, (result.stderr, console(job))
        seen = console(job).splitlines()[-1]
    finally:
        probe.unlink()
    assert seen == ("home-mounted" if keep else "home-absent")
