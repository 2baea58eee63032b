"""The Kubernetes emulator (tests/fakes/_kubesim/), for the tests of Kubernetes pools: an API
server and one node whose kubelet runs pods in Podman."""

from __future__ import annotations

import json
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx
from conftest import HTTP_TLS, ROOT, free_port, wait_for

from helpers.container_images import PODMAN_IMAGE

EMULATOR = ROOT / "tests" / "fakes" / "kubernetes" / "kube-emulator"
IMAGE = PODMAN_IMAGE  # in podman's local store: tests/conftest_services.py's `podman` builds it
NAMESPACE = "klique"
RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted"}
NODE = "emulated-node"
CONTAINER_LABEL = "klique.test/kubesim"  # tests/fakes/_kubesim/podman.py's LABEL


def kube_pool(url: str, **settings: Any) -> dict[str, Any]:
    """A Kubernetes pool's settings on the emulator at `url`: the namespace `klique`, the
    test image, pods run as alice; `settings` add to them or replace them."""
    pool = {
        "kind": "kubernetes",
        "namespace": NAMESPACE,
        "server": url,
        "image": IMAGE,
        "run_as_user": pwd.getpwnam("alice").pw_uid,
    }
    return {**pool, **settings}


class Emulator:
    """The emulator on a free port: one node with 8 CPUs, 16 GiB, two GPUs and eight shares of
    a GPU, the namespace `klique` (with `labels`, e.g. RESTRICTED) and any `namespaces` more.
    `toleration` is the seconds a pod stays on a NotReady node before the taint manager
    evicts it; `backoff_scale` shrinks the image pull back-off."""

    def __init__(
        self,
        labels: dict[str, str] | None = None,
        namespaces: dict[str, dict[str, str]] | None = None,
        toleration: float = 300,
        backoff_scale: float = 1.0,
    ) -> None:
        self.state = Path(tempfile.mkdtemp(prefix="klique-kube-", dir="/tmp"))
        self.state.chmod(0o755)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        spaces = {NAMESPACE: labels or {}, **(namespaces or {})}
        argv = [
            sys.executable, str(EMULATOR), "--port", str(self.port), "--state", str(self.state),
            "--cpu", "8", "--memory", "16Gi", "--history", "20000",
            "--resource", "nvidia.com/gpu=2", "--resource", "nvidia.com/gpu.shared=8",
            "--not-ready-toleration-s", str(toleration),
            "--image-backoff-scale", str(backoff_scale),
            *(f"--namespace={name}:{_labels(values)}" for name, values in spaces.items()),
        ]  # fmt: skip
        log = (self.state / "emulator.log").open("wb")
        self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        wait_for(self._up, 30, "the Kubernetes API emulator to answer")

    def _up(self) -> bool:
        try:
            return httpx.get(self.pods_url(), timeout=1, verify=HTTP_TLS).status_code == 200
        except httpx.TransportError:
            return False

    def api(self, path: str, namespace: str = NAMESPACE) -> str:
        return f"{self.url}/api/v1/namespaces/{namespace}/{path}"

    def pods_url(self) -> str:
        return self.api("pods")

    def pods(self, task_id: int) -> list[dict[str, Any]]:
        selector = {"labelSelector": f"klique.dev/task={task_id}"}
        answer = httpx.get(self.pods_url(), params=selector, verify=HTTP_TLS)
        return list(answer.json()["items"])

    def items(self, plural: str) -> list[dict[str, Any]]:
        return list(httpx.get(self.api(plural)).json()["items"])

    def emulator(self, path: str, body: dict[str, Any]) -> httpx.Response:
        """POST to an /emulator/ lever (tests/fakes/_kubesim/main.py lists them)."""
        answer = httpx.post(f"{self.url}/emulator/{path}", json=body, timeout=30)
        assert answer.status_code == 200, answer.text
        return answer

    def emulator_get(self, path: str) -> Any:
        return httpx.get(f"{self.url}/emulator/{path}").json()

    def pod_events(self) -> list[dict[str, Any]]:
        """Every pod ever created (name and labels), from the API's watch history."""
        params = {"watch": "1", "resourceVersion": "1", "timeoutSeconds": "0.5"}
        answer = httpx.get(self.pods_url(), params=params, timeout=30)
        created = [json.loads(line) for line in answer.text.splitlines() if line]
        return [
            {"name": e["object"]["metadata"]["name"], "labels": e["object"]["metadata"]["labels"]}
            for e in created
            if e["type"] == "ADDED"
        ]

    def node_ready(self, ready: bool) -> None:
        self.emulator(f"nodes/{NODE}", {"ready": ready})

    def job_folder(self, pod: dict[str, Any], volume: str = "klique-job") -> Path:
        """A pod's volume as the node holds it (an emptyDir the test may write into)."""
        return self.state / "pods" / pod["metadata"]["uid"] / "volumes" / volume

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
        self.process.terminate()  # its shutdown removes its containers
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        # Whatever a killed emulator left, by the label its containers carry.
        label = f"--filter=label={CONTAINER_LABEL}={self.state}"
        subprocess.run(["podman", "rm", "--force", "--time=0", label], capture_output=True)
        shutil.rmtree(self.state, ignore_errors=True)


def _labels(values: dict[str, str]) -> str:
    return ",".join(f"{key}={value}" for key, value in values.items())
