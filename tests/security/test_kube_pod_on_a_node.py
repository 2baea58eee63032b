"""A task that attacks its own pod, on a node that enforces what a kubelet enforces: the
emulator of tests/fakes/_kubesim/ runs the pod in Podman from the pool's image, whose
setuid-root interpreter (helpers/container_images.SETUID_PYTHON) is the way up it would take,
with the pod's volumes mounted as a kubelet mounts them."""

from __future__ import annotations

import pwd
from collections.abc import Iterator

import pytest
from conftest import ROOT, Server, start_server, stop_server
from helpers.container_images import SETUID_PYTHON
from helpers.estates import estate_yaml, profile
from helpers.kube import RESTRICTED, Emulator, kube_pool

pytestmark = pytest.mark.podman

ALICE = pwd.getpwnam("alice").pw_uid


@pytest.fixture(scope="module")
def server(podman, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    cluster = Emulator(labels=RESTRICTED)
    home = tmp_path_factory.mktemp("kube-attacks")
    pool = kube_pool(cluster.url, delete_grace="2s")
    resources = {"cpu": profile("k8s", cpus=1, memory="400M", walltime="1h")}
    (home / "estate.yaml").write_text(estate_yaml(resources=resources, pools={"k8s": pool}))
    started = start_server(home, home / "estate.yaml")
    yield started
    stop_server(started)
    cluster.stop()


ASK = "import os; print('euid', os.geteuid())"
# The task runs the image's setuid-root interpreter.
SETUID = (
    "import subprocess\n"
    f"done = subprocess.run([{SETUID_PYTHON!r}, '-c', {ASK!r}], capture_output=True)\n"
    "print(done.stdout.decode())"
)
# The task tries to change what the node mounted for its runner.
REWRITE = (
    "import os\n"
    "job = os.environ['KLIQUE_JOB_DIR']\n"
    "log = os.environ.get('KLIQUE_TERMINATION_LOG', '/dev/termination-log')\n"
    "tries = [\n"
    "    ('write task.json', lambda: open(job + '/task.json', 'ab').close()),\n"
    "    ('write runner', lambda: open('/opt/klique/klique-runner.pyz', 'ab').close()),\n"
    "    ('move task.json', lambda: os.replace(job + '/task.json', job + '/moved')),\n"
    "    ('remove message file', lambda: os.unlink(log)),\n"
    "]\n"
    "for what, attempt in tries:\n"
    "    try:\n"
    "        attempt(); print('DONE', what)\n"
    "    except OSError as exc:\n"
    "        print('refused', what, exc.strerror)\n"
)
# The task looks for a host file.
HOST = f"import os; print('host files visible:', os.path.exists({str(ROOT / 'pyproject.toml')!r}))"


@pytest.fixture(scope="module")
def outputs(server: Server) -> dict[str, str]:
    """Each attack's output, its tasks run side by side."""
    ids = {}
    with server.api() as api:
        for name, code in (("setuid", SETUID), ("rewrite", REWRITE), ("host", HOST)):
            body = {"command": ["python3", "-c", code], "resource": "cpu"}
            answer = api.post("/tasks", json=body)
            assert answer.status_code in (200, 201), answer.text
            ids[name] = int(answer.json()["id"])
    found = {}
    for name, task_id in ids.items():
        done = server.wait_state(task_id)
        found[name] = server.cli("logs", str(task_id)).output
        assert done["state"] == "completed", (done, found[name])
    return found


def test_a_setuid_root_binary_in_the_image_does_not_make_a_task_root(outputs):
    """allowPrivilegeEscalation: false (no_new_privs) keeps the setuid bit from raising it."""
    assert f"euid {ALICE}" in outputs["setuid"], outputs["setuid"]
    assert "euid 0" not in outputs["setuid"]


def test_a_task_cannot_rewrite_its_secret_the_runner_or_its_exit_record_file(outputs):
    """The task's Secret and the runner's ConfigMap are read-only mounts; the termination
    message file is a bind mount the task can neither remove nor replace."""
    output = outputs["rewrite"]
    assert "DONE" not in output and output.count("refused") == 4, output


def test_the_pods_of_this_module_ran_in_podman(outputs):
    """What the attacks above met was a container: the runner's view has no host files."""
    assert "host files visible: False" in outputs["host"], outputs["host"]
