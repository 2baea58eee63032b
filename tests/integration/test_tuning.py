"""Tuning end to end on the host pool: a base task whose objective is a known function of its
parameter, (x-3)^2, reported at every step; a TPE tuning of 8 trials, 2 at a time, with a median
pruner: the best trial beats the worst, an unpromising trial is cancelled through Klique with
the tuner's reason, each batch of trials is one sweep, and the trials budget ends the run."""

from __future__ import annotations

import asyncio
import json
from contextlib import closing

import pytest
from conftest import HOST_ACCESS, TASK_PY, start_server, stop_server, wait_for
from helpers.app import call, mcp_session
from helpers.web_session import signed_in

TEAMS = "teams:\n  vision: [alice]\n  nlp: [bob]\n"
ESTATE = (
    TEAMS
    + "resources:\n  cpu:\n    profile: {cpus: 1, memory: 1G, walltime: 1h, pools: [p]}\n"
    + "  1-gpu:\n    profile: {cpus: 1, memory: 1G, walltime: 1h, gpus: 1, pools: [p]}\n"
    + f"pools:\n  p:\n    kind: host\n    slots: 4\n    gpus: 2\n    {HOST_ACCESS}\n"
)
# The objective, (x-3)^2 plus a term that shrinks with the step, reported at 10 steps; the
# trial's "model" at the end.
TRAIN = """
import time, klique
task = klique.Task.init()
x = float(task.connect({"x": 0.0})["x"])
for step in range(10):
    task.log.scalar("loss", (x - 3) ** 2 + 1 / (step + 1), step=step)
    time.sleep(0.25)
with open("weights.txt", "w") as f:
    f.write(str(x))
task.register_model("tuned", "weights.txt")
"""


@pytest.fixture(scope="module")
def server(module_server_factory):
    return module_server_factory(ESTATE)


def base_task(server, token, script=TRAIN, resource="cpu"):
    """A task that records parameter x and reports its loss: the base of a tuning."""
    body = {"command": [TASK_PY, "-c", script], "resource": resource, "parameters": {"x": 0.0}}
    with server.api(token) as api:
        made = api.post("/sdk/tasks", json=body)
    assert made.status_code == 201, made.text
    return made.json()["id"]


def test_a_tpe_tuning_finds_a_better_x_prunes_and_stops_at_its_budget(server):
    alice = server.make_token("alice")
    base = base_task(server, alice)
    started = server.cli(
        "tune", str(base), "--param", "x=uniform:-10:10", "--objective", "loss", "--minimize",
        "--sampler", "tpe", "--trials", "8", "--concurrency", "2", "--pruner", "median",
        "--prune-after", "2", "--seed", "3", "--json",
        token=alice,
    )  # fmt: skip
    assert started.exit_code == 0, started.output
    tuning = json.loads(started.output)["id"]

    def ended():
        shown = json.loads(server.cli("tune", "show", str(tuning), "--json", token=alice).output)
        return shown if shown["state"] != "running" else None

    shown = wait_for(ended, 120, "the tuning to end", interval=0.5)
    trials = shown["trial_list"]
    assert shown["state"] == "completed", shown
    assert shown["reason"].startswith("made its 8 trials"), shown["reason"]
    assert len(trials) == 8 and all(t["task_id"] for t in trials)
    done = [t for t in trials if t["state"] == "complete"]
    assert shown["best"]["value"] == min(t["value"] for t in done)
    worst = max((t["params"]["x"] - 3) ** 2 for t in trials)
    assert (shown["best"]["params"]["x"] - 3) ** 2 < worst
    assert abs(shown["best"]["params"]["x"] - 3) < 3, shown["best"]
    # The best trial's model is on the record: the version its task registered.
    model = shown["best"]["model"]
    with server.api(alice) as api:
        version = api.get(f"/models/tuned/versions/{model['version']}").json()
    assert model["name"] == "tuned" and version["task_id"] == shown["best"]["task_id"], version

    pruned = [t for t in trials if t["state"] == "pruned"]
    assert pruned, trials
    with server.api(alice) as api:
        tasks = {t["task_id"]: api.get(f"/tasks/{t['task_id']}").json() for t in trials}
    for trial in pruned:
        task = tasks[trial["task_id"]]
        assert task["state"] == "cancelled", task
        assert task["reason"] == f"pruned by the tuner at step {trial['pruned_step']}", task
    # Trials are the tuning owner's tasks, clones of the base with the sampled value, made a
    # batch at a time as one sweep (a batch pool's job array).
    assert {t["owner"] for t in tasks.values()} == {"alice"}
    assert len({t["sweep"] for t in tasks.values()}) < len(trials)
    listed = server.cli("tune", "ls", token=alice)
    assert f"{tuning}" in listed.output and "8/8" in listed.output, listed.output
    assert shown["gpu_hours"] == 0  # a CPU resource: the ledger meters no GPU time
    assert over_mcp(server, alice, tuning)["best"] == shown["best"]
    with closing(signed_in(server, alice)) as browser:
        page = browser.get(f"/tunings/{tuning}")
        listed_page = browser.get("/tunings").text
    assert page.status_code == 200 and f'href="/tunings/{tuning}"' in listed_page
    assert page.text.count("<polyline") == 8 and page.text.count("data-trial-row") == 8
    assert "pruned by the tuner at step" in page.text and 'id="chart-data"' in page.text
    with closing(signed_in(server, server.make_token("bob"))) as browser:
        assert browser.get(f"/tunings/{tuning}").status_code == 404


def over_mcp(server, token, tuning):
    async def show():
        async with mcp_session(server, token) as session:
            listed = json.loads((await call(session, "list_tunings"))[1])
            assert [t["id"] for t in listed] == [tuning]
            return await call(session, "show_tuning", tuning_id=tuning)

    refused, text = asyncio.run(show())
    assert not refused, text
    return json.loads(text)


def test_the_gpu_hours_budget_stops_asking_and_cancels_the_running_trials(server):
    """Two trials that would hold a GPU each for a minute, under a budget of 0.001 GPU-hours
    (3.6 GPU-seconds): the ledger's metering spends it within seconds, and the tuner cancels
    them and ends the tuning, its cost the trials' ledger time."""
    alice = server.make_token("alice")
    base = base_task(server, alice, "import time; time.sleep(60)", "1-gpu")
    body = {
        "base_task": base,
        "params": ["x=uniform:0:1"],
        "objective": "loss",
        "trials": 10,
        "concurrency": 2,
        "gpu_hours": 0.001,
    }
    with server.api(alice) as api:
        made = api.post("/tunings", json=body)
        assert made.status_code == 201, made.text
        tuning = made.json()["id"]
        shown = wait_for(
            lambda: (t := api.get(f"/tunings/{tuning}").json())["state"] != "running" and t,
            90,
            "the tuning to spend its GPU-hours",
            interval=0.5,
        )
    trials = shown["trial_list"]
    assert shown["state"] == "completed", shown
    assert shown["reason"].startswith("spent its 0.001 GPU-hours"), shown["reason"]
    assert len(trials) == 2, trials  # no trial asked once the budget was spent
    assert {t["state"] for t in trials} == {"failed"}
    assert {t["reason"] for t in trials} == {
        "cancelled by the tuner: its tuning spent its 0.001 GPU-hours"
    }
    for trial in trials:
        assert server.task(trial["task_id"], alice)["state"] == "cancelled"
    assert 0.001 <= shown["gpu_hours"] < 0.01


def test_a_tuning_goes_on_after_a_server_restart(server, tmp_path):
    """The study is rebuilt from the trials' records: after a restart the tuning asks its
    remaining trials, numbered on from the last, and ends at its budget. (Last in this module:
    it replaces the module's server process.)"""
    alice = server.make_token("alice")
    base = base_task(server, alice, TRAIN.replace("range(10)", "range(4)"))
    body = {"base_task": base, "params": ["x=uniform:0:6"], "objective": "loss", "trials": 3}
    with server.api(alice) as api:
        tuning = api.post("/tunings", json=body).json()["id"]
        wait_for(
            lambda: api.get(f"/tunings/{tuning}").json()["trials"].get("complete"),
            60,
            "the first trial to complete",
            interval=0.2,
        )
    stop_server(server)
    estate = tmp_path / "estate.yaml"
    estate.write_text(ESTATE.replace("$JOB_ROOT", str(server.job_root)))
    again = start_server(server.home, estate)
    try:
        with again.api(alice) as api:
            shown = wait_for(
                lambda: (t := api.get(f"/tunings/{tuning}").json())["state"] != "running" and t,
                90,
                "the tuning to end after the restart",
                interval=0.5,
            )
    finally:
        stop_server(again)
    numbers = [t["number"] for t in shown["trial_list"]]
    assert shown["state"] == "completed" and numbers == [0, 1, 2], shown
    assert shown["best"]["value"] == min(
        t["value"] for t in shown["trial_list"] if t["state"] == "complete"
    )
