"""The PBS Professional, Torque and LSF simulators in tests/fakes, driven as programs on PATH.

Jobs are submitted as 'alice' through runuser when the tests run as root (the way the
broker submits as a mapped account), otherwise as the current user. Every wait polls
a condition against a deadline.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import pwd
import time
from pathlib import Path

import pytest
from helpers.sim_cluster import FAKES, Cluster, as_account, simulated, wait_for

from broker.pools.pbs_parse import qstat_text_jobs

FLAVORS = ["pbspro", "torque", "lsf"]


@pytest.fixture(params=FLAVORS)
def cluster(request):
    with simulated(request.param) as sim:
        yield sim


ENV_VARS = {
    "pbspro": [
        "PBS_JOBID",
        "PBS_JOBNAME",
        "PBS_NODEFILE",
        "PBS_O_WORKDIR",
        "PBS_QUEUE",
        "PBS_O_HOST",
        "PBS_ENVIRONMENT",
        "TMPDIR",
    ],
    "torque": [
        "PBS_JOBID",
        "PBS_JOBNAME",
        "PBS_NODEFILE",
        "PBS_O_WORKDIR",
        "PBS_QUEUE",
        "PBS_NUM_PPN",
        "PBS_NP",
        "PBS_GPUFILE",
        "TMPDIR",
    ],
    "lsf": [
        "LSB_JOBID",
        "LSB_JOBNAME",
        "LSB_HOSTS",
        "LSB_MCPU_HOSTS",
        "LSB_QUEUE",
        "LSB_DJOB_NUMPROC",
        "LS_SUBCWD",
        "TMPDIR",
    ],
}


def _read_env(path: Path) -> dict:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def test_job_runs_as_the_submitter_with_the_scheduler_environment(cluster):
    out = cluster.work / "env.txt"
    script = cluster.script("envjob", f"id -u > {out}.uid\nenv > {out}\n")
    job_id = cluster.submit(script)
    status = cluster.wait_state(job_id, "done")
    assert status["exit"] == 0
    assert int((cluster.work / "env.txt.uid").read_text()) == pwd.getpwnam(cluster.user).pw_uid
    env = _read_env(out)
    missing = [name for name in ENV_VARS[cluster.flavor] if name not in env]
    assert not missing, f"missing {missing} in {sorted(env)}"
    if cluster.flavor == "lsf":
        assert env["LSB_JOBID"] == job_id and env["LS_SUBCWD"] == str(cluster.work)
    else:
        assert env["PBS_JOBID"] == job_id and env["PBS_O_WORKDIR"] == str(cluster.work)
        assert Path(env["PBS_NODEFILE"]).name == "nodefile"


def test_exit_status_of_a_failing_job_is_reported(cluster):
    job_id = cluster.submit(cluster.script("failing", "echo about to fail\nexit 7\n"))
    status = cluster.wait_state(job_id, "done")
    assert status["exit"] == 7
    assert "about to fail" in (cluster.work / "failing.out").read_text()
    if cluster.flavor == "lsf":
        assert status["raw"]["STAT"] == "EXIT"


def test_walltime_overrun_is_killed_and_reported_as_documented(cluster):
    script = cluster.script("overrun", "sleep 60\n")
    started = time.monotonic()
    job_id = cluster.submit(script, *cluster.walltime_args(2))
    status = cluster.wait_state(job_id, "done")
    assert time.monotonic() - started < 20
    expected = {"pbspro": -29, "torque": -11, "lsf": 140}[cluster.flavor]
    assert status["exit"] == expected
    if cluster.flavor == "lsf":
        assert status["reason"].startswith("TERM_RUNLIMIT")
    else:
        assert "=>> PBS: job killed: walltime" in (cluster.work / "overrun.out").read_text()


def test_cancel_terminates_the_job_process_group(cluster):
    # The vendors' 10 s between a cancel's signals (PBS kill_delay, LSF JOB_TERMINATE_INTERVAL),
    # not the fixture's 1 s: the first signal alone must end the job, however loaded the machine.
    # Every command names it, as each command's settings become the simulated server's.
    cluster.env["KLIQUE_SIM_KILL_DELAY"] = "10"
    marker = cluster.work / "cancel.started"
    job_id = cluster.submit(cluster.script("cancelme", f"touch {marker}\nsleep 60\n"))
    wait_for(marker.exists, what="the job to start")
    done = cluster.cancel(job_id)
    assert done.returncode == 0, done.stderr
    status = cluster.wait_state(job_id, "done")
    if cluster.flavor == "lsf":
        assert status["exit"] == 130 and status["reason"].startswith("TERM_OWNER")
    else:
        assert status["exit"] == 271


def test_gpu_jobs_get_distinct_devices_and_wait_while_gpus_are_busy(cluster):
    release = cluster.work / "release"
    body = (
        "echo $CUDA_VISIBLE_DEVICES > {out}\n"
        f"i=0; while [ ! -e {release} ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done\n"
    )
    ids, outs = [], []
    for n in range(3):
        out = cluster.work / f"gpus{n}.txt"
        outs.append(out)
        ids.append(
            cluster.submit(cluster.script(f"gpu{n}", body.format(out=out)), *cluster.gpu_args(2))
        )
    wait_for(lambda: outs[0].exists() and outs[1].exists(), what="two GPU jobs to start")
    first = set(outs[0].read_text().split()[0].split(","))
    second = set(outs[1].read_text().split()[0].split(","))
    assert len(first) == len(second) == 2 and not first & second
    third = cluster.status(ids[2])
    assert third["state"] == "queued"
    assert not outs[2].exists()
    release.touch()
    for job_id in ids:
        assert cluster.wait_state(job_id, "done")["exit"] == 0
    assert len(outs[2].read_text().split()[0].split(",")) == 2


def test_fifty_concurrent_submissions_get_distinct_ids_and_all_run(cluster):
    script = cluster.script("many", f'touch {cluster.work}/ran.$(basename "$0").$$\n')
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        ids = list(pool.map(lambda _: cluster.submit(script), range(50)))
    assert len(set(ids)) == 50
    wait_for(
        lambda: all(cluster.states().get(j) == "done" for j in ids),
        timeout=90,
        what="fifty jobs to finish",
    )
    assert len(list(cluster.work.glob("ran.*"))) == 50


def test_unknown_jobs_are_refused_with_the_documented_status(cluster):
    if cluster.flavor == "lsf":
        done = cluster.run("bjobs", "424242")
        assert done.returncode == 255 and "Job <424242> is not found" in done.stderr
        done = cluster.run("bkill", "424242")
        assert done.returncode == 255 and "Job <424242>: No matching job found" in done.stderr
        return
    server = cluster.submit(cluster.script("probe", "true\n")).split(".", 1)[1]
    done = cluster.run("qstat", "424242")
    text = "Unknown Job Id Error" if cluster.flavor == "torque" else "Unknown Job Id"
    assert done.returncode == 153 and f"qstat: {text} 424242.{server}" in done.stderr
    done = cluster.run("qdel", "424242")
    assert done.returncode == 153 and f"qdel: Unknown Job Id 424242.{server}" in done.stderr


def test_finished_jobs_stay_in_history_for_the_keep_time(cluster):
    keep = {"KLIQUE_SIM_KEEP": "2"}
    job_id = cluster.submit(cluster.script("brief", "true\n"), env=keep)
    cluster.wait_state(job_id, "done")
    if cluster.flavor == "pbspro":
        done = cluster.run("qstat", job_id)
        assert done.returncode == 35 and "use -x or -H" in done.stderr
    if cluster.flavor == "lsf":
        assert job_id not in cluster.run("bjobs", "-u", "all").stdout
        assert job_id in cluster.run("bjobs", "-a", "-u", "all").stdout
    wait_for(lambda: cluster.status(job_id) is None, what="the finished job to be purged")


def test_unknown_queue_is_refused(cluster):
    script = cluster.script("noqueue", "true\n")
    if cluster.flavor == "lsf":
        done = cluster.run("bsub", "-q", "nosuch", stdin=script.read_text())
        assert done.returncode == 255
        assert done.stderr.strip() == "nosuch: No such queue. Job not submitted."
    else:
        done = cluster.run("qsub", "-q", "nosuch", str(script))
        assert done.returncode == {"pbspro": 170, "torque": 172}[cluster.flavor]
        assert "Unknown queue" in done.stderr


def test_command_line_options_win_over_script_directives(cluster):
    if cluster.flavor == "lsf":
        text = "#!/bin/sh\n#BSUB -J fromscript\n#BSUB -q nosuch\n#BSUB -n 3\ntrue\n"
        done = cluster.run("bsub", "-q", "normal", "-J", "fromcli", stdin=text)
        assert done.returncode == 0, done.stderr
        job_id = done.stdout.split("<")[1].split(">")[0]
        cluster.submitted.append(job_id)
        fields = cluster.run("bjobs", "-o", "job_name nreq_slot", "-json", job_id).stdout
        record = json.loads(fields)["RECORDS"][0]
        assert (record["JOB_NAME"], record["NREQ_SLOT"]) == ("fromcli", "3")
        return
    script = cluster.script("directives", "")
    script.write_text(
        "#!/bin/sh\n#PBS -N fromscript\n#PBS -q nosuch\n#PBS -l walltime=1:00:00\ntrue\n"
    )
    queue = {"pbspro": "workq", "torque": "batch"}[cluster.flavor]
    done = cluster.run("qsub", "-q", queue, "-N", "fromcli", str(script))
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    cluster.submitted.append(job_id)
    raw = cluster.status(job_id)["raw"]
    walltime = (
        raw["Resource_List"]["walltime"]
        if cluster.flavor == "pbspro"
        else raw["Resource_List.walltime"]
    )
    assert (raw["Job_Name"], walltime) == ("fromcli", "01:00:00")


def test_status_commands_answer_quickly(cluster):
    command = "bjobs" if cluster.flavor == "lsf" else "qstat"
    cluster.run(command, as_root=True)
    timings = []
    for _ in range(5):
        started = time.monotonic()
        cluster.run(command, "-a" if command == "bjobs" else "-x", as_root=True)
        timings.append(time.monotonic() - started)
    assert sorted(timings)[2] < 0.5, timings


@pytest.mark.parametrize("folder", ["pbs", "torque", "lsf"])
def test_captured_outputs_are_indexed_and_well_formed(folder):
    data = FAKES.parent / "data" / folder
    cases = json.loads((data / "index.json").read_text())
    named = {name for case in cases for name in (case["stdout"], case["stderr"]) if name}
    on_disk = {p.name for p in data.iterdir()} - {"index.json", "README.md"}
    assert named == on_disk
    for case in cases:
        assert isinstance(case["exit_status"], int) and case["command"]
        if case["stdout"] and case["stdout"].endswith(".json") and case.get("valid_json", True):
            report = json.loads((data / case["stdout"]).read_text())
            assert ("RECORDS" in report) if folder == "lsf" else ("pbs_server" in report)


@pytest.mark.skipif(
    os.environ.get("KLIQUE_SIM_STRESS") != "1",
    reason="set KLIQUE_SIM_STRESS=1 for the 500-submission stress run",
)
def test_five_hundred_submissions_from_several_processes(cluster):
    script = cluster.script("stress", f"touch {cluster.work}/ran.$$\n")
    with concurrent.futures.ThreadPoolExecutor(max_workers=10) as pool:
        ids = list(pool.map(lambda _: cluster.submit(script), range(500)))
    assert len(set(ids)) == 500
    wait_for(
        lambda: all(cluster.states().get(j) == "done" for j in ids),
        timeout=300,
        what="five hundred jobs to finish",
    )
    assert len(list(cluster.work.glob("ran.*"))) == 500


# ---- server settings: the vendor's default and the common other value -----------------------


def _waiting_job(
    cluster: Cluster, name: str, extra: tuple[str, ...] = (), **kw
) -> tuple[str, Path]:
    release = cluster.work / f"{name}.release"
    body = f"while [ ! -e {release} ]; do sleep 0.05; done\n"
    return cluster.submit(cluster.script(name, body), *extra, **kw), release


@pytest.mark.parametrize("cluster", ["pbspro"], indirect=True)
def test_pbs_pro_without_job_history_refuses_x_and_forgets_finished_jobs(cluster):
    cluster.env["KLIQUE_SIM_JOB_HISTORY_ENABLE"] = "false"  # PBS Professional's default
    job_id, release = _waiting_job(cluster, "nohistory")
    asked = cluster.run("qstat", "-x", "-f", "-F", "json", job_id)
    assert asked.returncode == 0
    assert asked.stderr == f"qstat: PBS is not configured to maintain job history {job_id}\n"
    assert "Jobs" not in json.loads(asked.stdout)
    listed = cluster.run("qstat", "-f", "-F", "json", job_id)
    assert job_id in json.loads(listed.stdout)["Jobs"]
    release.touch()

    def forgotten() -> bool:
        done = cluster.run("qstat", "-f", "-F", "json", job_id)
        return done.returncode == 153 and f"Unknown Job Id {job_id}" in done.stderr

    wait_for(forgotten, what="the finished job to be forgotten")


@pytest.mark.parametrize(
    ("cluster", "setting", "visible"),
    [
        ("torque", None, False),  # Torque's default: query_other_jobs false
        ("torque", "true", True),
        ("pbspro", None, True),  # PBS Professional's default: true
        ("pbspro", "false", False),
    ],
    indirect=["cluster"],
)
def test_query_other_jobs_decides_who_sees_a_job(cluster, setting, visible):
    env = {"KLIQUE_SIM_QUERY_OTHER_JOBS": setting} if setting else {}
    job_id, release = _waiting_job(cluster, "private", env=env)
    by_id = as_account("bob", cluster, "qstat", "-f", job_id)
    listing = as_account("bob", cluster, "qstat")
    release.touch()
    if visible:
        assert by_id.returncode == 0 and f"Job Id: {job_id}" in by_id.stdout
        assert job_id.split(".")[0] in listing.stdout
    else:
        assert by_id.returncode == 159
        assert by_id.stderr == f"qstat: Unauthorized Request  {job_id}\n"
        assert job_id.split(".")[0] not in listing.stdout
    assert cluster.run("qstat", "-f", job_id).returncode in (0, 35)  # the owner always sees it


@pytest.mark.parametrize("cluster", ["torque"], indirect=True)
def test_torque_answers_another_accounts_array_with_nothing_and_exit_0(cluster):
    """query_other_jobs false (Torque's default): TORQUE src/server/req_stat.c skips the
    permission error for an array's jobs, so another account's array named by its id shows
    nothing and exits 0, where one of its subjobs named alone is refused."""
    job_id, release = _waiting_job(cluster, "hidden-array", extra=("-t", "0-1"))
    number, _, server = job_id.partition("[]")
    as_array = as_account("bob", cluster, "qstat", "-t", "-f", "-1", job_id)
    as_subjob = as_account("bob", cluster, "qstat", "-f", "-1", f"{number}[0]{server}")
    own = cluster.run("qstat", "-t", "-f", "-1", job_id)
    release.touch()
    assert (as_array.returncode, as_array.stdout, as_array.stderr) == (0, "", "")
    assert as_subjob.returncode == 159 and "Unauthorized Request" in as_subjob.stderr
    assert own.stdout.count("Job Id:") == 2  # its owner sees both subjobs


@pytest.mark.parametrize(("cluster", "level"), [("lsf", None), ("lsf", "1")], indirect=["cluster"])
def test_lsfs_secure_job_info_level_hides_other_users_jobs(cluster, level):
    """lsb.params SECURE_JOB_INFO_LEVEL (default 0): at 1 to 5 a user sees only their own
    jobs; `bparams -a` shows the level."""
    env = {"KLIQUE_SIM_LSF_SECURE_JOB_INFO_LEVEL": level} if level else {}
    job_id, release = _waiting_job(cluster, "secret", env=env)
    listing = as_account("bob", cluster, "bjobs", "-a", "-u", "all", "-o", "jobid", "-json")
    by_id = as_account("bob", cluster, "bjobs", "-o", "jobid", "-json", job_id)
    params = as_account("bob", cluster, "bparams", "-a")
    release.touch()
    assert f"SECURE_JOB_INFO_LEVEL = {level or 0}" in params.stdout
    shown = [r["JOBID"] for r in json.loads(listing.stdout)["RECORDS"]]
    named = json.loads(by_id.stdout)["RECORDS"]
    if level:
        assert shown == [] and named == [{"JOBID": job_id, "ERROR": f"Job <{job_id}> is not found"}]
    else:
        assert shown == [job_id] and named == [{"JOBID": job_id}]


@pytest.mark.parametrize(
    ("cluster", "version", "status"),
    [("pbspro", "2022.1.3.20230614134139", -29), ("pbspro", "19.1.3", 271)],
    indirect=["cluster"],
)
def test_a_pbs_walltime_kill_reports_the_code_of_its_version(cluster, version, status):
    script = cluster.script("overrun", "sleep 60\n")
    job_id = cluster.submit(script, "-l", "walltime=2", env={"KLIQUE_SIM_PBS_VERSION": version})
    ended = cluster.wait_state(job_id, "done")
    raw = ended["raw"]
    assert (ended["exit"], raw["substate"]) == (status, 93)
    used, limit = raw["resources_used"]["walltime"], raw["Resource_List"]["walltime"]
    assert used > limit  # the MoM kills once the walltime used is past the limit
    assert cluster.run("qstat", "--version").stdout == f"pbs_version = {version}\n"


@pytest.mark.parametrize("cluster", ["lsf"], indirect=True)
def test_lsf_warns_at_the_run_limit_and_kills_after_the_grace(cluster):
    body = "trap 'echo warned' USR2\nwhile true; do sleep 0.2; echo tick; done\n"
    grace = {"KLIQUE_SIM_LSF_RUNLIMIT_GRACE": "2"}
    job_id = cluster.submit(cluster.script("warned", body), "-W", "1", env=grace)
    ended = cluster.wait_state(job_id, "done")
    assert ended["reason"].startswith("TERM_RUNLIMIT")
    output = (cluster.work / "warned.out").read_text()
    assert "tick" in output.split("warned", 1)[1]  # it ran on after the warning


@pytest.mark.parametrize(
    ("cluster", "setting", "status"), [("lsf", None, 0), ("lsf", "Y", 255)], indirect=["cluster"]
)
def test_bjobs_with_nothing_to_show_exits_as_the_setting_says(cluster, setting, status):
    env = {"KLIQUE_SIM_BJOBS_CONSISTENT_EXIT_CODE": setting} if setting else {}
    done = cluster.run("bjobs", env=env)
    assert (done.returncode, done.stderr) == (status, "No unfinished job found\n")
    as_json = cluster.run("bjobs", "-o", "jobid stat", "-json", env=env)
    assert as_json.returncode == status and json.loads(as_json.stdout)["RECORDS"] == []


def test_a_kill_reaches_every_process_of_the_job(cluster):
    pid_file = cluster.work / "child.pid"
    child = (
        "import os, signal, time; os.setpgrp(); signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        f"open('{pid_file}.tmp', 'w').write(str(os.getpid())); "
        f"os.rename('{pid_file}.tmp', '{pid_file}'); time.sleep(120)"
    )
    script = cluster.script("family", f'python3 -c "{child}" &\nwait\n')
    job_id = cluster.submit(script)
    wait_for(pid_file.exists, what="the job's child to start")
    pid = int(pid_file.read_text())
    assert cluster.cancel(job_id).returncode == 0
    cluster.wait_state(job_id, "done")
    wait_for(lambda: not Path(f"/proc/{pid}").exists(), what="the child in its own group to die")


@pytest.mark.parametrize("cluster", ["lsf"], indirect=True)
def test_an_lsf_job_array_runs_each_element_as_a_job_of_its_own(cluster):
    """bsub -J "name[1-3]": one number for the array, each element its own job with its index
    in LSB_JOBINDEX and %I, listed as name[i]; bkill "N[i]" ends that element alone."""
    release = cluster.work / "third.release"
    body = (
        'echo "job $LSB_JOBID index $LSB_JOBINDEX"\n'
        '[ "$LSB_JOBINDEX" = 2 ] && exit 3\n'
        f'[ "$LSB_JOBINDEX" = 3 ] && while [ ! -e {release} ]; do sleep 0.05; done\n'
        "exit 0\n"
    )
    out = str(cluster.work / "arr.%J.%I.out")
    done = cluster.run("bsub", "-J", "arr[1-3]", "-o", out, stdin="#!/bin/sh\n" + body)
    assert done.returncode == 0, done.stderr
    array = done.stdout.split("<")[1].split(">")[0]
    cluster.wait_state(f"{array}[1]", "done")
    assert cluster.wait_state(f"{array}[2]", "done")["exit"] == 3
    cluster.wait_state(f"{array}[3]", "running")
    killed = cluster.cancel(f"{array}[3]")
    assert killed.stdout == f"Job <{array}[3]> is being terminated\n"
    assert cluster.wait_state(f"{array}[3]", "done")["reason"].startswith("TERM_OWNER")
    listing = cluster.run("bjobs", "-a", "-o", "jobid jobindex job_name stat", "-json", array)
    rows = [
        (r["JOBID"], r["JOBINDEX"], r["JOB_NAME"], r["STAT"])
        for r in json.loads(listing.stdout)["RECORDS"]
    ]
    assert sorted(rows, key=lambda r: r[1]) == [
        (array, "1", "arr[1]", "DONE"),
        (array, "2", "arr[2]", "EXIT"),
        (array, "3", "arr[3]", "EXIT"),
    ]
    for index in (1, 2, 3):
        text = (cluster.work / f"arr.{array}.{index}.out").read_text()
        assert text.startswith(f"job {array} index {index}\n")
        assert f"Subject: Job {array}[{index}]: <arr[{index}]>" in text


@pytest.mark.parametrize("cluster", ["lsf"], indirect=True)
def test_lsf_refuses_a_bad_array_and_bkill_of_its_number_ends_every_element(cluster):
    """An index list that is not start[-end[:step]] of positive integers, or an index above
    MAX_JOB_ARRAY_SIZE, is refused; `bkill N` ends every unfinished element of array N."""
    small = {"KLIQUE_SIM_LSF_MAX_JOB_ARRAY_SIZE": "5"}
    for spec, words in [
        ("x[0-2]", "Job array index error"),
        ("x[1-5", "Job array index error"),
        ("x[3-1]", "Job array index error"),
        ("x[a]", "Job array index error"),
        ("x[1-6]", "Job array index too large"),
    ]:
        done = cluster.run("bsub", "-J", spec, "true", env=small)
        assert (done.returncode, done.stderr) == (255, f"{words}. Job not submitted.\n"), spec
    done = cluster.run("bsub", "-J", "x[1-5:2]", "sleep 60", env=small)
    assert done.returncode == 0, done.stderr
    array = done.stdout.split("<")[1].split(">")[0]
    for index in (1, 3, 5):
        cluster.wait_state(f"{array}[{index}]", "running")
    assert cluster.status(f"{array}[2]") is None  # the step leaves 2 out
    assert cluster.cancel(array).stdout == f"Job <{array}> is being terminated\n"
    for index in (1, 3, 5):
        assert cluster.wait_state(f"{array}[{index}]", "done")["reason"].startswith("TERM_OWNER")


@pytest.mark.parametrize("cluster", ["torque"], indirect=True)
def test_a_torque_job_array_shows_a_summary_and_with_t_each_subjob(cluster):
    """qsub -t 0-2 (TORQUE 6.1 "Job arrays"): qsub prints N[].server; each subjob N[i] is a job
    of its own, named and with its output path as the array's plus "-<i>", its index in
    PBS_ARRAYID and job_array_id; qstat shows one summary per array (R while a subjob runs),
    qstat -t the subjobs only; qdel N[i] of a completed subjob is a completed job's refusal and
    qdel N[] deletes the rest; max_job_array_size, where set, refuses a larger array."""
    release = cluster.work / "arr.release"
    body = (
        'echo "$PBS_JOBID $PBS_ARRAYID $PBS_JOBNAME"\n'
        '[ "$PBS_ARRAYID" = 1 ] && exit 3\n'
        f'[ "$PBS_ARRAYID" = 2 ] && while [ ! -e {release} ]; do sleep 0.05; done\n'
        "exit 0\n"
    )
    script = cluster.script("arr", body)
    out = str(cluster.work / "arr.out")
    limited = cluster.run(
        "qsub", "-t", "0-2", str(script), env={"KLIQUE_SIM_TORQUE_MAX_JOB_ARRAY_SIZE": "2"}
    )
    assert limited.returncode == 235
    assert "Bad Job Array Request MSG=Requested array size too large, limit is 2" in (
        limited.stderr
    )
    done = cluster.run("qsub", "-N", "arr", "-t", "0-2", "-j", "oe", "-o", out, str(script))
    assert done.returncode == 0, done.stderr
    array = done.stdout.strip()
    number, server = array.split("[]")

    def listed(*flags: str) -> dict:
        shown = cluster.run("qstat", *flags, "-f", "-1", array)
        return dict(qstat_text_jobs(shown.stdout)) if shown.returncode == 0 else {}

    def ended_and_running() -> bool:
        jobs = listed("-t")
        states = [jobs.get(f"{number}[{i}]{server}", {}).get("job_state") for i in range(3)]
        return states == ["C", "C", "R"]

    wait_for(ended_and_running, what="subjobs 0 and 1 to end while 2 runs")
    jobs = listed("-t")
    assert array not in jobs
    first, failed = jobs[f"{number}[0]{server}"], jobs[f"{number}[1]{server}"]
    assert (first["Job_Name"], first["job_array_id"], first["exit_status"]) == ("arr-0", "0", "0")
    assert (failed["exit_status"], failed["Output_Path"].endswith("/arr.out-1")) == ("3", True)
    assert Path(cluster.work, "arr.out-0").read_text() == f"{number}[0]{server} 0 arr-0\n"
    [(summary_id, summary)] = listed().items()
    assert (summary_id, summary["job_state"], summary["Job_Name"]) == (array, "R", "arr")
    assert summary["job_array_request"] == "0-2"
    again = cluster.run("qdel", f"{number}[1]{server}")
    assert (again.returncode, again.stderr) == (
        170,
        "qdel: Request invalid for state of job MSG=invalid state for job - COMPLETE "
        f"{number}[1]{server}\n",
    )
    assert cluster.run("qdel", array).returncode == 0
    wait_for(lambda: listed().get(array, {}).get("job_state") == "C", what="the array to end")
    unknown = cluster.run("qstat", "-t", "-f", "-1", f"{int(number) + 99}[]{server}")
    assert unknown.returncode == 234
    assert unknown.stderr.startswith("qstat: Unknown Array ID MSG=unable to find array ")


@pytest.mark.parametrize("cluster", ["pbspro"], indirect=True)
def test_a_pbs_pro_job_array_without_history_shows_ended_subjobs_until_it_leaves(cluster):
    """qsub -J 0-2: the array N[] and subjobs N[i], each with PBS_ARRAY_INDEX; without job
    history an ended subjob shows through its array (X, "Subjob finished" or "Subjob failed",
    no array_index)
    while the array is there, qdel of it is refused, and the array leaves once all ended."""
    cluster.env["KLIQUE_SIM_JOB_HISTORY_ENABLE"] = "false"  # PBS Professional's default
    release = cluster.work / "arr.release"
    body = (
        'echo "$PBS_JOBID $PBS_ARRAY_ID $PBS_ARRAY_INDEX"\n'
        '[ "$PBS_ARRAY_INDEX" = 1 ] && exit 3\n'
        f'[ "$PBS_ARRAY_INDEX" = 2 ] && while [ ! -e {release} ]; do sleep 0.05; done\n'
        "exit 0\n"
    )
    out = str(cluster.work / "arr.^array_index^.out")
    script = cluster.script("arr", body)
    refused = cluster.run("qsub", "-J", "3-3", str(script))
    assert refused.returncode == 2 and refused.stderr.startswith("qsub: illegal -J value")
    done = cluster.run("qsub", "-N", "arr", "-J", "0-2", "-j", "oe", "-o", out, str(script))
    assert done.returncode == 0, done.stderr
    array = done.stdout.strip()
    number, server = array.split("[]")

    def listed() -> dict:
        shown = cluster.run("qstat", "-t", "-f", "-F", "json", array)
        return json.loads(shown.stdout).get("Jobs", {}) if shown.returncode == 0 else {}

    def ended_and_running() -> bool:
        jobs = listed()
        states = [jobs.get(f"{number}[{i}]{server}", {}).get("job_state") for i in range(3)]
        return states == ["X", "X", "R"]

    wait_for(ended_and_running, what="subjobs 0 and 1 to end while 2 runs")
    jobs = listed()
    assert jobs[array]["job_state"] == "B" and jobs[array]["array_indices_submitted"] == "0-2"
    ended = jobs[f"{number}[1]{server}"]
    assert ended["comment"] == "Subjob failed" and "array_index" not in ended  # it exited 3
    assert jobs[f"{number}[0]{server}"]["comment"] == "Subjob finished"
    assert jobs[f"{number}[2]{server}"]["array_index"] == 2
    assert Path(cluster.work, "arr.0.out").read_text() == f"{number}[0]{server} {array} 0\n"
    again = cluster.run("qdel", f"{number}[1]{server}")
    assert again.returncode == 55
    assert again.stderr == f"qdel: Request invalid for finished array subjob {number}[1]{server}\n"
    release.touch()

    def gone() -> bool:
        shown = cluster.run("qstat", "-t", "-f", "-F", "json", array)
        return shown.returncode == 153 and f"Unknown Job Id {array}" in shown.stderr

    wait_for(gone, what="the ended array to leave the server")
