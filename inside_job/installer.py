"""Create a virtual environment and install requirements into it: uv, or venv + pip."""

from __future__ import annotations

import os
import shutil
import subprocess

from inside_job.errors import SetupFailed, telling_line
from inside_job.locks import FileLock

TYPE_CHECKING = False
if TYPE_CHECKING:
    from inside_job.envsource import Source


def with_uv(uv: str, python: str, dest: str, source: Source, cache: str, compile_now: bool) -> None:
    """uv venv --relocatable + uv pip install, with a node-local cache."""
    os.makedirs(cache, exist_ok=True)
    env = dict(os.environ, UV_CACHE_DIR=cache, UV_PYTHON_DOWNLOADS="never", UV_NO_PROGRESS="1")
    # Sites put their own certificate authorities in the system store, as pip and git see it.
    env.setdefault("UV_SYSTEM_CERTS", "1")
    if os.stat(cache).st_dev != os.stat(os.path.dirname(dest)).st_dev:
        env["UV_LINK_MODE"] = "copy"  # hard links cannot cross file systems
    _run(
        [uv, "venv", "--quiet", "--relocatable", "--no-project", "--python", python, dest],
        env,
        "uv",
    )
    requirements = _requirements_file(dest, source)
    try:
        compile_flag = ["--compile-bytecode"] if compile_now else []
        python_in_env = os.path.join(dest, "bin", "python")
        argv = [uv, "pip", "install", "--quiet", *compile_flag, "--python", python_in_env]
        _run([*argv, "-r", requirements], env, "uv")
    finally:
        _drop(requirements, source)


def with_pip(python: str, dest: str, final: str, source: Source, cache: str) -> None:
    """python -m venv + pip install (pip byte-compiles); scripts are pointed at the final path."""
    os.makedirs(cache, exist_ok=True)
    env = dict(os.environ, PIP_CACHE_DIR=cache, PIP_DISABLE_PIP_VERSION_CHECK="1")
    _run([python, "-m", "venv", dest], env, "venv")
    requirements = _requirements_file(dest, source)
    try:
        _run(
            [
                os.path.join(dest, "bin", "python"),
                "-m",
                "pip",
                "install",
                "--quiet",
                "-r",
                requirements,
            ],
            env,
            "pip",
        )
    finally:
        _drop(requirements, source)
    retarget_scripts(os.path.join(dest, "bin"), dest, final)


def compile_in_background(env_dir: str, use_lock: str) -> None:
    """Byte-compile a ready environment at low priority while the first task runs.

    Bytecode files are written atomically, so tasks that import meanwhile are safe. The
    compiler inherits a shared hold on the environment's use lock, so eviction never removes
    the folder under it (it would recreate the __pycache__ folders it writes to).
    """
    python = os.path.join(env_dir, "bin", "python")
    argv = [python, "-m", "compileall", "-q", "-j", "0", os.path.join(env_dir, "lib")]
    nice = shutil.which("nice")
    hold = FileLock(use_lock)
    try:
        hold.shared()
        subprocess.Popen(
            [nice, "-n", "10", *argv] if nice else argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            pass_fds=(hold.fd,),
        )
    finally:
        hold.close()  # the child's copy of the descriptor keeps the hold until it exits


def retarget_scripts(bin_dir: str, old: str, new: str) -> None:
    """Rewrite '#!<old>/bin/python' lines to <new>, so the folder still works once renamed."""
    old_line = f"#!{old}/".encode()
    for name in os.listdir(bin_dir):
        path = os.path.join(bin_dir, name)
        if os.path.islink(path) or not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            data = f.read()
        if data.startswith(old_line):
            with open(path, "wb") as f:
                f.write(f"#!{new}/".encode() + data[len(old_line) :])


def _requirements_file(dest: str, source: Source) -> str:
    if source.lines is None:
        assert source.path is not None
        return source.path
    path = f"{dest}.requirements.txt"
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(source.lines) + "\n")
    return path


def _drop(requirements: str, source: Source) -> None:
    if requirements != source.path and os.path.exists(requirements):
        os.unlink(requirements)


def _run(argv: list[str], env: dict[str, str], tool: str) -> None:
    result = subprocess.run(
        argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        detail = telling_line(result.stderr + result.stdout, f"exit code {result.returncode}")
        raise SetupFailed(f"installing the requirements with {tool} failed: {detail}")
