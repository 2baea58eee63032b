"""Run a command in a root file system through Charliecloud's ch-run, as a container runtime
would: exactly the environment given, the binds, the working folder, and a simulated /dev.

The host has no GPUs, and an unprivileged process cannot mount over /dev, so the GPU device
nodes the container would see are files `nvidiaN` in `/.klique-sim/dev` of the root file system,
and the command gets `KLIQUE_SIM_DEV=/.klique-sim/dev` (tests/fakes/gpu-probe reads it as CUDA
would read /dev). The host's GPUs are `KLIQUE_SIM_HOST_GPUS` (default 4: nvidia0..3).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

DEV_VIEW = "/.klique-sim/dev"


def host_gpus() -> list[str]:
    return [str(i) for i in range(int(os.environ.get("KLIQUE_SIM_HOST_GPUS", "4")))]


def select_gpus(visible: str | None) -> list[str]:
    """The host GPUs named by an NVIDIA_VISIBLE_DEVICES value (nvidia-container-runtime,
    "Environment variables": all, none, void, or a comma list of indices)."""
    if visible is None or visible in ("", "void", "none"):
        return []
    if visible == "all":
        return host_gpus()
    return [v for v in visible.split(",") if v in host_gpus()]


def make_dev_view(rootfs: str, gpus: list[str]) -> None:
    path = os.path.join(rootfs, DEV_VIEW.lstrip("/"))
    os.makedirs(path, exist_ok=True)
    for name in os.listdir(path):
        os.unlink(os.path.join(path, name))
    for gpu in gpus:
        open(os.path.join(path, f"nvidia{gpu}"), "w").close()


def run(
    rootfs: str,
    argv: list[str],
    env: dict[str, str],
    binds: list[tuple[str, str]],
    cwd: str,
    gpus: list[str],
) -> int:
    """Run argv in rootfs and return its exit status (128+N after signal N, as a shell)."""
    make_dev_view(rootfs, gpus)
    env = dict(env, KLIQUE_SIM_DEV=DEV_VIEW)
    chrun = ["ch-run", "--unset-env=*", "--env-no-expand", "--no-passwd"]
    chrun += [f"--set-env={k}='{v}'" for k, v in env.items()]
    for host, inner in binds:
        if not os.path.exists(host):
            sys.stderr.write(f"mount source does not exist: {host}\n")
            return 1
        os.makedirs(os.path.join(rootfs, inner.lstrip("/")), exist_ok=True)
        chrun += ["-b", f"{host}:{inner}"]
    chrun += ["-c", cwd, rootfs, "--", *argv]
    launcher_env = dict(os.environ)
    launcher_env.setdefault("USER", str(os.getuid()))
    return forward_and_wait(subprocess.Popen(chrun, env=launcher_env))


def forward_and_wait(child: subprocess.Popen) -> int:
    """Pass SIGTERM/SIGINT/SIGUSR1/SIGUSR2 on to the child, as the runtimes do; its status."""

    def forward(signum: int, frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, forward)
    status = child.wait()
    return 128 - status if status < 0 else status
