"""The Slurm pool on the real cluster from scripts/slurm-up, over both transports."""

import json
import os
import pwd

import pytest
from conftest import submitted_id, wait_for

pytestmark = pytest.mark.slurm
JOB_PYTHON = "/usr/bin/python3"  # the test accounts cannot read the virtual environment's

REPORT = (
    "import json, os, sys; print(json.dumps({'uid': os.getuid(), 'gid': os.getgid(), "
    "'argv': sys.argv[1:], 'env': {k: v for k, v in os.environ.items() "
    "if k.startswith('HOSTILE') or k in ('CUDA_VISIBLE_DEVICES', 'SLURM_JOB_GPUS')}}))"
)


def slurm_estate(job_root, transport: str, ssh_dir: str = "/tmp/klique-ssh") -> str:
    if transport == "ssh":
        how = (
            f"{{kind: ssh, host: 127.0.0.1, port: 2222, known_hosts: {ssh_dir}/known_hosts, "
            f"client_keys: [{ssh_dir}/client_key]}}"
        )
    else:
        how = "{kind: local}"
    return f"""
teams:
  vision: [alice]
  nlp: [bob, mallory]
resources:
  cpu:
    profile: {{cpus: 1, memory: 100M, walltime: 10m, pools: [slurm]}}
  2-gpu:
    profile: {{gpus: 2, cpus: 1, memory: 100M, walltime: 10m, pools: [slurm]}}
  short:
    profile: {{cpus: 1, memory: 100M, walltime: 1m, pools: [slurm]}}
  huge:
    profile: {{gpus: 9, cpus: 1, memory: 100M, walltime: 10m, pools: [slurm]}}
pools:
  slurm:
    kind: slurm
    partition: debug
    job_root: {job_root}
    transport: {how}
    python: {JOB_PYTHON}
    poll_interval: 1s
    lost_after: 30s
    accounting: jobcomp
    user_map: {{alice: alice, bob: bob}}
"""


@pytest.fixture(scope="module", params=["local", pytest.param("ssh", marks=pytest.mark.ssh)])
def slurm_server(request, tmp_path_factory, slurm_cluster):
    from conftest import start_server, stop_server

    if request.param == "ssh":
        request.getfixturevalue("sshd")
    base = tmp_path_factory.mktemp(f"slurm-{request.param}")
    job_root = slurm_cluster.work / f"jobs-{request.param}-{os.getpid()}"
    job_root.mkdir(mode=0o1777)
    os.chmod(job_root, 0o1777)
    estate = base / "estate.yaml"
    estate.write_text(slurm_estate(job_root, request.param))
    server = start_server(base / "home", estate)
    server.tokens = {u: server.make_token(u) for u in ("alice", "bob", "mallory")}
    yield server
    stop_server(server)


def output_of(server, task_id, token):
    logs = server.cli("logs", str(task_id), token=token).output
    return json.loads(logs.strip().splitlines()[-1])


@pytest.mark.parametrize("user", ["alice", "bob"])
def test_a_task_runs_as_the_users_own_account(slurm_server, user):
    token = slurm_server.tokens[user]
    task_id = submitted_id(
        slurm_server.cli(
            "submit", "--no-code", "--json", "--", JOB_PYTHON, "-c", REPORT, token=token
        )
    )
    task = slurm_server.wait_state(task_id, token=token, timeout=90)
    assert task["state"] == "completed", task
    account = pwd.getpwnam(user)
    seen = output_of(slurm_server, task_id, token)
    assert (seen["uid"], seen["gid"]) == (account.pw_uid, account.pw_gid)
    assert task["native_id"].isdigit()


def test_an_unmapped_user_is_refused_with_a_reason(slurm_server):
    token = slurm_server.tokens["mallory"]
    task_id = submitted_id(
        slurm_server.cli("submit", "--no-code", "--json", "--", "true", token=token)
    )
    task = slurm_server.wait_state(task_id, token=token)
    assert task["state"] == "failed" and task["native_id"] is None
    assert "'mallory'" in task["reason"] and "user_map" in task["reason"]


def test_a_gpu_task_sees_exactly_the_gpus_slurm_gave_it(slurm_server):
    token = slurm_server.tokens["alice"]
    task_id = submitted_id(
        slurm_server.cli(
            "submit",
            "--no-code",
            "--json",
            "-r",
            "2-gpu",
            "--",
            JOB_PYTHON,
            "-c",
            REPORT,
            token=token,
        )
    )
    task = slurm_server.wait_state(task_id, token=token, timeout=90)
    assert task["state"] == "completed", task
    env = output_of(slurm_server, task_id, token)["env"]
    granted = env["SLURM_JOB_GPUS"].split(",")
    assert len(granted) == 2
    assert env["CUDA_VISIBLE_DEVICES"].split(",") == granted


def test_a_failing_command_fails_with_its_exit_code(slurm_server):
    token = slurm_server.tokens["bob"]
    task_id = submitted_id(
        slurm_server.cli(
            "submit",
            "--no-code",
            "--json",
            "--",
            JOB_PYTHON,
            "-c",
            "raise SystemExit(7)",
            token=token,
        )
    )
    task = slurm_server.wait_state(task_id, token=token, timeout=90)
    assert (task["state"], task["exit_code"]) == ("failed", 7)


def test_cancel_ends_cancelled_and_the_job_leaves_slurm(slurm_server):
    import subprocess

    token = slurm_server.tokens["alice"]
    task_id = submitted_id(
        slurm_server.cli("submit", "--no-code", "--json", "--", "sleep", "600", token=token)
    )
    task = slurm_server.wait_state(task_id, {"running"}, token=token, timeout=90)
    assert slurm_server.cli("cancel", str(task_id), token=token).exit_code == 0
    assert slurm_server.task(task_id, token)["state"] == "cancelled"

    def gone():
        out = subprocess.run(
            ["squeue", "--noheader", "--jobs", task["native_id"], "--format=%T"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        return out in ("", "CANCELLED")

    wait_for(gone, 60, f"job {task['native_id']} to leave the queue")


def test_a_profile_slurm_cannot_satisfy_is_refused_in_slurms_words(slurm_server):
    token = slurm_server.tokens["alice"]
    task_id = submitted_id(
        slurm_server.cli("submit", "--no-code", "--json", "-r", "huge", "--", "true", token=token)
    )
    task = slurm_server.wait_state(task_id, token=token)
    assert task["state"] == "failed"
    assert "Requested node configuration is not available" in task["reason"]


HOSTILE = [
    'it\'s "quoted"',
    "$(touch /tmp/klique-pwned)",
    "`touch /tmp/klique-pwned`",
    "line one\nline two",
    "#SBATCH --uid=0",
    "; rm -rf / ;",
    "\\\\ \t tab",
    "ünïcødé ✓",
]


def test_hostile_strings_reach_the_job_byte_for_byte(slurm_server):
    token = slurm_server.tokens["bob"]
    env = {f"HOSTILE_{i}": s for i, s in enumerate(HOSTILE)}
    with slurm_server.api(token) as api:
        task = api.post(
            "/tasks",
            json={
                "command": [JOB_PYTHON, "-c", REPORT, *HOSTILE],
                "name": HOSTILE[4] + HOSTILE[1],
                "env": env,
            },
        ).json()
    done = slurm_server.wait_state(task["id"], token=token, timeout=90)
    assert done["state"] == "completed", done
    seen = output_of(slurm_server, task["id"], token)
    assert seen["argv"] == HOSTILE
    assert {k: v for k, v in seen["env"].items() if k.startswith("HOSTILE")} == env
    assert not os.path.exists("/tmp/klique-pwned")
    with open(os.path.join(done["job_dir"], "job.sh")) as f:
        script = f.read()
    assert all(s not in script for s in HOSTILE)


def test_a_walltime_overrun_ends_timeout(slurm_server):
    token = slurm_server.tokens["alice"]
    task_id = submitted_id(
        slurm_server.cli(
            "submit", "--no-code", "--json", "-r", "short", "--", "sleep", "600", token=token
        )
    )
    task = slurm_server.wait_state(task_id, token=token, timeout=180)
    assert task["state"] == "timeout", task
    assert "walltime" in task["reason"]
