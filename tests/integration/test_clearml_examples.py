"""Three scripts written as ClearML's examples are (examples/clearml/), run unchanged but for
their import line, as alice on a login node, on the host pool and on the real Slurm pool: a
decorator pipeline of three steps on two compute resources, a training script sent to a queue
with execute_remotely, and a pipeline step that reads another task's artifacts with
Task.get_task. Their records are checked through the API, and each run's page is taken in
headless chromium (docs/screenshots/clearml-*.png)."""

from __future__ import annotations

import pickle
import re
import shutil
import subprocess
import uuid
from types import SimpleNamespace

import pytest
from conftest import HOST_ACCESS_SETTINGS, ROOT
from helpers.batch import batch_pool, open_folder, remove_tree
from helpers.estates import estate_yaml, profile
from helpers.sdk import GIT, recorded_id, trusted_checkout
from selenium.webdriver.common.by import By
from web.conftest import browser, screenshot  # noqa: F401 (browser: the fixture)
from web.test_browser import sign_in

EXAMPLES = ROOT / "examples" / "clearml"
HOST_POOL = {"kind": "host", "slots": 4, "gpus": 2, **HOST_ACCESS_SETTINGS}


def examples_estate(pool: str, settings: dict) -> str:
    """The examples' queues, `cpu` and `gpu`, as compute resources on the one pool `pool`."""
    allocation = {"cpus": 1, "memory": "200M", "walltime": "10m"}
    return estate_yaml(
        defaults={"pipeline_resource": "cpu"},
        resources={"cpu": profile(pool, **allocation), "gpu": profile(pool, gpus=1, **allocation)},
        pools={pool: settings},
    )


@pytest.fixture(scope="module")
def checkout():
    """Alice's checkout holding the examples, as committed (the import line is Klique's)."""
    with trusted_checkout() as made:
        for script in EXAMPLES.glob("*.py"):
            shutil.copy(script, made.repo / script.name)
        subprocess.run([*GIT, "add", "."], cwd=made.repo, check=True)
        subprocess.run([*GIT, "commit", "-qm", "examples"], cwd=made.repo, check=True)
        subprocess.run(["chown", "-R", "alice:alice", str(made.repo)], check=True)
        yield made


@pytest.fixture(scope="module", params=["host", pytest.param("slurm", marks=pytest.mark.slurm)])
def pool(request, module_server_factory):
    """A server whose `cpu` and `gpu` are on the host pool, or on the Slurm cluster."""
    if request.param == "host":
        yield "host", module_server_factory(examples_estate("host", HOST_POOL))
        return
    cluster = request.getfixturevalue("slurm_cluster")
    job_root = open_folder(cluster.work / f"clearml-{uuid.uuid4().hex[:8]}")
    yield (
        "batch",
        module_server_factory(examples_estate("batch", batch_pool("slurm", job_root, None))),
    )
    remove_tree(job_root)


def test_the_clearml_examples_run_with_their_import_line_changed(pool, checkout, browser):  # noqa: F811
    name, server = pool
    token = server.make_token("alice")
    for script in EXAMPLES.glob("*.py"):  # each differs from ClearML's by its import line only
        lines = script.read_text().splitlines()
        imports = [line for line in lines if line.startswith(("from ", "import "))]
        assert "from klique import" in "\n".join(imports), script
        assert not any("clearml" in line for line in imports), script
    runs = {
        "pipeline": ["pipeline_from_decorator.py"],
        "train": ["train_with_tensorboard.py", "--lr", "0.2", "--epochs", "3", "--queue", "cpu"],
        "functions": ["pipeline_from_functions.py"],
    }
    started = {k: checkout.run(server, token, *argv, background=True) for k, argv in runs.items()}
    out = {}
    for key, process in started.items():
        stdout, _ = process.communicate(timeout=300)
        assert process.returncode == 0, (key, stdout)
        out[key] = stdout

    with server.api(token) as api:
        pipeline_id = decorator_pipeline(server, api, token, name, out["pipeline"])
        train_id = training_script(server, api, token, name, out["train"])
        process_id = artifact_reader(server, api, token, name, out["functions"])

    shown = {"pipeline": pipeline_id, "train": train_id, "step": process_id}
    for key, task_id in shown.items():
        sign_in(browser, SimpleNamespace(server=server), token, f"/tasks/{task_id}")
        heading = browser.find_element(By.TAG_NAME, "h1").text
        assert heading.startswith(f"Task {task_id}: "), heading
        screenshot(browser, f"clearml-{key}-{'slurm' if name == 'batch' else 'host'}")


def decorator_pipeline(server, api, token, pool: str, stdout: str) -> int:
    """Three steps on cpu, gpu, cpu; a one-name return is the value itself, not a 1-tuple;
    a step's result used as a number in the pipeline's body is its value."""
    assert "accuracy=100.0%" in stdout, stdout
    slope = re.search(r"slope=([0-9.]+)", stdout)
    assert slope and abs(float(slope.group(1)) - 3) < 0.01, stdout
    pipeline_id = recorded_id(stdout)
    pipeline = server.wait_state(pipeline_id, token=token)
    assert pipeline["state"] == "completed", pipeline
    assert pipeline["parameters"] == {"rows": 20, "Pipeline/version": "1.0.0"}
    steps = api.get(f"/sdk/tasks/{pipeline_id}/steps").json()
    placed = [(s["name"], s["resource"], s["pool"], s["state"]) for s in steps]
    assert placed == [
        ("prepare", "cpu", pool, "completed"),
        ("train", "gpu", pool, "completed"),
        ("evaluate", "cpu", pool, "completed"),
    ]
    dataset = api.get(f"/tasks/{steps[0]['id']}/artifacts/dataset")
    assert pickle.loads(dataset.content)[:2] == [(0, 0.9), (1, 4.0)]  # a list, not a 1-tuple
    names = [a["name"] for a in api.get(f"/tasks/{steps[1]['id']}/artifacts").json()]
    assert sorted(names) == ["intercept", "slope"]
    return pipeline_id


def training_script(server, api, token, pool: str, stdout: str) -> int:
    """Recorded here with its arguments, then the same task on `cpu` reporting its scalars."""
    assert "queued on cpu" in stdout, stdout
    task_id = recorded_id(stdout)
    task = server.wait_state(task_id, token=token, timeout=120)
    logs = server.cli("logs", str(task_id), token=token).output
    assert task["state"] == "completed", (task, logs)
    assert (task["resource"], task["pool"], task["name"]) == ("cpu", pool, "train with tensorboard")
    assert task["parameters"] == {"Args/lr": 0.2, "Args/epochs": 3, "Args/queue": "cpu"}
    lines = {(s["name"], s["series"]) for s in task["scalars"]}
    assert {("loss", "train"), ("weight", "w")} <= lines, lines
    assert "final loss" in logs, logs
    kinds = {r["kind"] for r in api.get(f"/tasks/{task_id}/reports").json()}
    assert {"single", "text"} <= kinds, kinds
    return task_id


def artifact_reader(server, api, token, pool: str, stdout: str) -> int:
    """make_dataset's table (with its metadata) and folder, read by `process` through
    Task.get_task(task_id=${make_dataset.id})."""
    pipeline_id = recorded_id(stdout)
    assert server.wait_state(pipeline_id, token=token)["state"] == "completed"
    steps = {s["name"]: s for s in api.get(f"/sdk/tasks/{pipeline_id}/steps").json()}
    made, process = steps["make_dataset"], steps["process"]
    placed = (process["state"], process["pool"], process["needs"])
    assert placed == ("completed", pool, [made["id"]])
    source = server.task(made["id"], token)
    assert source["parameters"]["artifact_metadata/dataset"] == {"rows": 10}
    kinds = {a["name"]: a["kind"] for a in source["artifacts"]}
    assert kinds == {"dataset": "object", "samples": "folder", "result": "object"}, kinds
    summary = pickle.loads(api.get(f"/tasks/{process['id']}/artifacts/summary").content)
    samples = [f"sample-{x}.txt" for x in range(3)]
    assert summary == {"rows": 10, "samples": samples, "total": 2 * sum(x * x for x in range(10))}
    tables = api.get(f"/tasks/{process['id']}/reports", params={"kind": "table"}).json()
    assert [t["title"] for t in tables] == ["dataset"], tables
    logs = server.cli("logs", str(process["id"]), token=token).output
    assert f"read 10 rows and 3 samples from task {made['id']}\n" in logs, logs
    return int(process["id"])
