"""The Kubernetes API emulator, for the tests of Kubernetes pools."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx
from conftest import HTTP_TLS, ROOT, free_port, wait_for

EMULATOR = ROOT / "tests" / "fakes" / "kubernetes" / "kube-emulator"
IMAGE = "localhost/python:3.11"
NAMESPACE = "klique"


class Emulator:
    """The API emulator and kubelet stand-in of tests/fakes/kubernetes/, on a free port: one
    node with 8 CPUs, 16 GiB, two GPUs and eight shares of a GPU, which pulls only `images`."""

    def __init__(self, images: tuple[str, ...] = (IMAGE,)) -> None:
        self.state = Path(tempfile.mkdtemp(prefix="klique-kube-", dir="/tmp"))
        self.state.chmod(0o755)  # alice reaches her pods' folders
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [
            sys.executable, str(EMULATOR), "--port", str(self.port), "--state", str(self.state),
            *(f"--image={image}" for image in images), "--cpu", "8", "--memory", "16Gi",
            "--resource", "nvidia.com/gpu=2", "--resource", "nvidia.com/gpu.shared=8",
        ]  # fmt: skip
        log = (self.state / "emulator.log").open("wb")
        self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        wait_for(self._up, 30, "the Kubernetes API emulator to answer")

    def _up(self) -> bool:
        try:
            return httpx.get(self.pods_url(), timeout=1, verify=HTTP_TLS).status_code == 200
        except httpx.TransportError:
            return False

    def pods_url(self) -> str:
        return f"{self.url}/api/v1/namespaces/{NAMESPACE}/pods"

    def pods(self, task_id: int) -> list[dict[str, Any]]:
        selector = {"labelSelector": f"klique.dev/task={task_id}"}
        answer = httpx.get(self.pods_url(), params=selector, verify=HTTP_TLS)
        return list(answer.json()["items"])

    def lists(self) -> int:
        """Lists of the pool's pods by the watch's selector (pool and installation) served:
        the start-up check's look by the pool's label alone is not one."""
        served = httpx.get(f"{self.url}/emulator/requests").json()["list"]
        return sum(
            n
            for selector, n in served.items()
            if "klique.dev/pool=k8s" in selector and "klique.dev/installation=" in selector
        )

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)
        shutil.rmtree(self.state, ignore_errors=True)
