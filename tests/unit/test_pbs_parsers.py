"""PBS Professional and Torque: the parsers on captured qsub/qstat output, the state table, the
directives and the script they make."""

import asyncio
import json
from pathlib import Path

import pytest
from helpers.scripted_transport import ScriptedTransport

from broker.domain import TaskState
from broker.errors import SubmitError, TemplateError, TransportError
from broker.estate import parse_estate
from broker.pools.base import Context
from broker.pools.pbs import PbsDriver
from broker.pools.pbs_json import repair
from broker.pools.pbs_parse import (
    PBS_ALL_STATES,
    PBSPRO_EXEC_CODES,
    TORQUE_EXEC_CODES,
    ending,
    parse_qstat_json,
    parse_qstat_text,
    parse_qsub,
    qstat_text_jobs,
)
from broker.preview import sample_task
from broker.transport import Completed

DATA = Path(__file__).resolve().parents[1] / "data"
PBS = DATA / "pbs"
TORQUE = DATA / "torque"

# `qstat -f -1 1972 1985` of Debian's slurm-wlm-torque 22.05 wrappers (tab-indented, no
# exit_status), captured on the cluster of scripts/slurm-up.
SLURM_WRAPPER_QSTAT = (
    "Job Id:\t1972\n\tJob_Name = klique-99\n\tJob_Owner = alice@localhost\n\tjob_state = C\n"
    "\tqueue = debug\n\tqtime = Sun Nov 29 21:39:12 2026\n\texec_host = localhost/1\n"
    "\tResource_List.walltime = 00:01:00\n\tResource_List.nodect = 1\n\n"
    "Job Id:\t1985\n\tJob_Name = klique-98\n\tJob_Owner = alice@localhost\n\tjob_state = R\n"
    "\tqueue = debug\n\tResource_List.ncpus = 2\n\n"
)


def seen(statuses):
    return {s.native_id: (s.name, s.state, s.exit_code) for s in statuses}


def test_qsub_prints_the_job_id():
    assert parse_qsub((PBS / "qsub.stdout").read_text()) == "4334.pbs01"
    assert parse_qsub((TORQUE / "qsub.stdout").read_text()) == "2355.tq-head.cluster.example.org"
    assert parse_qsub("1972\n") == "1972"  # the slurm-wlm-torque wrapper: Slurm's bare id


@pytest.mark.parametrize("text", ["", "qsub: Unknown queue", "There was an error running"])
def test_qsub_without_a_job_id_is_a_submit_error(text):
    with pytest.raises(SubmitError):
        parse_qsub(text)


def test_qstat_json_with_history_gives_every_job_its_state_and_exit():
    jobs = seen(parse_qstat_json((PBS / "qstat_f_F_json_x.json").read_text()))
    assert jobs == {
        "4321.pbs01": ("klique-41", "Q", None),
        "4322.pbs01": ("klique-42", "H", None),
        "4323.pbs01": ("klique-43", "R", None),
        "4324.pbs01": ("klique-44", "E", None),
        "4325.pbs01": ("klique-45", "F/completed", 0),
        "4326.pbs01": ("klique-46", "F/walltime", None),
        "4327.pbs01": ("klique-47", "F/deleted", 143),
        "4328.pbs01": ("klique-48", "F/deleted", None),
        "4329.pbs01": ("klique-49", "F/failed", 1),
        "4330.pbs01": ("klique-50", "W", None),
        "4331.pbs01": ("klique-51", "S", None),
        "4332.pbs01": ("klique-52", "M", None),
        "4333[].pbs01": ("klique-53", "B", None),
    }
    states = {k: PBS_ALL_STATES[state] for k, (_, state, _) in jobs.items()}
    assert states["4326.pbs01"] is TaskState.TIMEOUT
    assert states["4327.pbs01"] is states["4328.pbs01"] is TaskState.CANCELLED
    assert states["4324.pbs01"] is TaskState.RUNNING  # exiting: the exit file is not final yet


def test_a_queued_job_carries_the_schedulers_comment_as_its_reason():
    jobs = {s.native_id: s for s in parse_qstat_json((PBS / "qstat_f_F_json_x.json").read_text())}
    assert jobs["4321.pbs01"].reason.startswith("Not Running: Insufficient amount of resource")
    assert jobs["4326.pbs01"].reason == "exit status -29"


def test_qstat_json_without_jobs_and_for_an_array():
    assert parse_qstat_json((PBS / "qstat_f_F_json_no_jobs.json").read_text()) == []
    jobs = seen(parse_qstat_json((PBS / "qstat_f_F_json_x_t_array.json").read_text()))
    assert jobs["4333[0].pbs01"][1:] == ("X/completed", 0)
    assert {state for _, state, _ in jobs.values()} <= set(PBS_ALL_STATES)


def test_pbs_pro_long_text_agrees_with_its_json():
    text = seen(parse_qstat_text((PBS / "qstat_f_x.txt").read_text(), PBSPRO_EXEC_CODES))
    full = seen(parse_qstat_json((PBS / "qstat_f_F_json_x.json").read_text()))
    assert text == {job_id: full[job_id] for job_id in ("4323.pbs01", "4325.pbs01")}


def test_torque_qstat_f_gives_every_job_its_state_and_exit():
    jobs = seen(parse_qstat_text((TORQUE / "qstat_f.txt").read_text(), TORQUE_EXEC_CODES))
    assert {k.split(".")[0]: v[1:] for k, v in jobs.items()} == {
        "2345": ("Q", None),
        "2346": ("H", None),
        "2347": ("W", None),
        "2348": ("R", None),
        "2349": ("E", None),
        "2350": ("C/completed", 0),
        "2351": ("C/walltime", None),
        "2352": ("C/deleted", 143),
        "2353": ("C/exec", None),
        "2354": ("C/failed", 1),
    }
    assert PBS_ALL_STATES["C/walltime"] is TaskState.TIMEOUT
    assert PBS_ALL_STATES["C/exec"] is TaskState.FAILED


def test_torque_long_values_read_the_same_broken_or_on_one_line():
    broken = dict(qstat_text_jobs((TORQUE / "qstat_f.txt").read_text()))
    single = dict(qstat_text_jobs((TORQUE / "qstat_f_1.txt").read_text()))
    assert broken == single
    job = broken["2345.tq-head.cluster.example.org"]
    assert job["Error_Path"].endswith("/klique/jobs/klique-61/pbs.err")
    assert "PBS_O_WORKDIR=/scratch/alice/klique/jobs/klique-61" in job["Variable_List"]


def test_the_slurm_torque_wrappers_tab_indented_format():
    jobs = seen(parse_qstat_text(SLURM_WRAPPER_QSTAT, TORQUE_EXEC_CODES))
    # No exit_status: an ended job looks deleted, and the exit file has to decide.
    assert jobs == {"1972": ("klique-99", "C/deleted", None), "1985": ("klique-98", "R", None)}


@pytest.mark.parametrize(
    ("status", "substate", "codes", "expected"),
    [
        (0, 92, PBSPRO_EXEC_CODES, "completed"),
        (3, 92, PBSPRO_EXEC_CODES, "failed"),
        (-29, 93, PBSPRO_EXEC_CODES, "walltime"),
        (-27, 93, PBSPRO_EXEC_CODES, "memory"),
        (-3, 93, PBSPRO_EXEC_CODES, "exec"),
        (265, 92, PBSPRO_EXEC_CODES, "signal"),  # 256 + SIGKILL
        (271, None, TORQUE_EXEC_CODES, "deleted"),  # 256 + SIGTERM: qdel
        (143, None, TORQUE_EXEC_CODES, "deleted"),  # the job caught qdel's SIGTERM
        (None, 91, PBSPRO_EXEC_CODES, "deleted"),
        (-11, None, TORQUE_EXEC_CODES, "walltime"),
        (-11, None, PBSPRO_EXEC_CODES, "exec"),  # -11 is not PBS Professional's walltime code
        # PBS Professional reads a deletion from its substate on every version: 271 or 143
        # alone are no deletion there.
        (271, 91, PBSPRO_EXEC_CODES, "deleted"),
        (143, 91, PBSPRO_EXEC_CODES, "deleted"),
        (271, 93, PBSPRO_EXEC_CODES, "signal"),
        (143, 93, PBSPRO_EXEC_CODES, "failed"),
    ],
)
def test_how_a_finished_job_ended(status, substate, codes, expected):
    assert ending(status, substate, codes) == expected


@pytest.mark.parametrize(
    ("status", "substate"),
    [(271, 93), (265, 93), (143, 93), (0, 92), (-29, 93)],  # SIGTERM, SIGKILL, caught, exited 0
)
def test_a_walltime_kill_before_job_exec_kill_walltime_is_read_from_walltime_used(status, substate):
    # PBS Professional before 2021.1 reports the job's own status after the MoM's SIGTERM;
    # the MoM kills only once the walltime used is past the limit.
    assert ending(status, substate, PBSPRO_EXEC_CODES, overran=True) == "walltime"
    assert ending(status, 91, PBSPRO_EXEC_CODES, overran=True) == "deleted"


def record(**changes):
    """One finished job of the captured PBS Professional JSON, with some attributes changed."""
    doc = json.loads((PBS / "qstat_f_F_json_x.json").read_text())
    attrs = doc["Jobs"]["4329.pbs01"]
    for name, value in changes.items():
        group, _, key = name.partition("__")
        if key:
            attrs[group][key] = value
        else:
            attrs[group] = value
    return json.dumps({"pbs_server": "pbs01", "Jobs": {"4329.pbs01": attrs}})


def test_an_older_pbs_walltime_kill_parses_as_timeout_from_the_record():
    text = record(Exit_status=271, resources_used__walltime="00:30:01")
    [job] = parse_qstat_json(text)
    assert job.state == "F/walltime" and PBS_ALL_STATES[job.state] is TaskState.TIMEOUT
    assert "walltime used past its limit" in job.reason
    [within] = parse_qstat_json(record(Exit_status=271, resources_used__walltime="00:29:59"))
    assert within.state == "F/signal"


def test_published_pbs_pro_json_reads():
    jobs = seen(parse_qstat_json((PBS / "qstat_x_f_F_json_metacentrum.json").read_text()))
    assert jobs == {"12860476.meta-pbs.metacentrum.cz": ("swrap_01", "R", None)}


def test_invalid_json_of_known_pbs_versions_reads_every_job():
    bare = seen(parse_qstat_json((PBS / "qstat_f_F_json_bare_values.json").read_text()))
    assert bare == {
        "53.testpbs.nas.nasa.gov": ("STDIN", "H", None),
        "54.testpbs.nas.nasa.gov": ("STDIN", "Q", None),
    }
    escaped = parse_qstat_json((PBS / "qstat_f_F_json_bad_escapes.json").read_text())
    assert [(s.native_id, s.state, s.problem) for s in escaped] == [("27.pbsserver", "R", "")]


def test_the_repair_keeps_what_pbs_meant():
    text = (PBS / "qstat_f_F_json_bare_values.json").read_text()
    variables = json.loads(repair(text), strict=False)["Jobs"]["54.testpbs.nas.nasa.gov"][
        "Variable_List"
    ]
    assert [variables[f"FOO{i}"] for i in range(7)] == [
        "00123",
        ".123",
        "123.",
        "00",
        "-00",
        "00.123",
        "-00.123",
    ]
    escaped = json.loads(
        repair((PBS / "qstat_f_F_json_bad_escapes.json").read_text()), strict=False
    )
    variables = escaped["Jobs"]["27.pbsserver"]["Variable_List"]
    assert (variables["MYVAR"], variables["MYVAR3"]) == ("'\"asads\"'", "ab,c")
    assert variables["MYVAR2"] == "/home/pbstest01/Mo\\'"
    assert repair('{"a":-29,"b":1e5,"c":true,"d":"x"}') == '{"a":-29,"b":1e5,"c":true,"d":"x"}'


def test_one_unreadable_record_leaves_the_other_jobs_readable():
    text = (PBS / "qstat_f_F_json_x.json").read_text()
    # A record no repair reads (a doubled comma), amid jobs that read.
    broken = text.replace('"Job_Name":"klique-43",', '"Job_Name":"klique-43",,', 1)
    statuses = {s.native_id: s for s in parse_qstat_json(broken)}
    assert set(statuses) == set(seen(parse_qstat_json(text)))
    assert statuses["4323.pbs01"].problem.startswith("its qstat JSON is invalid")
    assert statuses["4323.pbs01"].state == ""
    assert statuses["4325.pbs01"].state == "F/completed" and not statuses["4325.pbs01"].problem
    with pytest.raises(TransportError):
        parse_qstat_json("qstat: cannot connect to server pbs01 (errno=15010)")


def test_published_torque_output_reads_with_its_continuations():
    jobs = seen(parse_qstat_text((TORQUE / "qstat_f_mavis.txt").read_text(), TORQUE_EXEC_CODES))
    assert jobs == {
        "9.torque01.bcgsc.ca": ("subtest.sh", "C/completed", 0),
        # The subjob's Job_Name is its array's with "-1" (job_array_id 1): the array's name.
        "48[1].torque01.bcgsc.ca": (
            "MA_mock-A47933_batch-JT3CUggKXNStHcoFXYaGR3",
            "C/deleted",
            143,
        ),
    }
    attrs = dict(qstat_text_jobs((TORQUE / "qstat_f_mavis.txt").read_text()))
    assert attrs["9.torque01.bcgsc.ca"]["Error_Path"].endswith("/creisle/temp/subtest.sh.e9")
    comment = attrs["48[1].torque01.bcgsc.ca"]["comment"]
    assert "dependency of array 43[].torque01.bcgsc.ca can never" in comment


def test_history_off_is_detected_and_status_asks_without_x():
    pbs, _ = driver()
    pbs._job_ids = {"alice": ["4323.pbs01", "4325.pbs01"]}
    argv = pbs.status_argv(["alice"])
    refused = Completed(
        0,
        (PBS / "qstat_f_F_json_no_jobs.json").read_text(),
        (PBS / "qstat_x_history_off.stderr").read_text(),
    )
    assert pbs.status_again(argv, refused)
    assert pbs.status_argv(["alice"]) == ["qstat", "-f", "-F", "json", "4323.pbs01", "4325.pbs01"]
    assert not pbs.status_again(pbs.status_argv(["alice"]), Completed(0, "{}", ""))


def test_another_users_job_refused_means_status_per_account():
    pbs, _ = driver()
    for refusal in (PBS / "qstat_unauthorized.stderr", TORQUE / "qstat_unauthorized.stderr"):
        assert pbs.OTHERS_HIDDEN.search(refusal.read_text())
        assert not pbs.status_listed(Completed(159, "", refusal.read_text()))


def test_the_moms_walltime_note_names_a_walltime_kill():
    pbs, _ = driver()
    assert pbs.ending_note("/scratch/klique/klique-7") == "/scratch/klique/klique-7/pbs.out"
    note = "started\n=>> PBS: job killed: walltime 6 exceeded limit 5\n"
    assert pbs.parse_ending_note(note) == "F/walltime"
    assert pbs.parse_ending_note("walltime 6 exceeded limit 5 in a user's own output\n") is None


def driver(pool_settings="", profile="gpus: 1, cpus: 2, memory: 512M, walltime: 90m"):
    estate = parse_estate(
        f"""
resources:
  r:
    profile: {{pools: [p], {profile}}}
pools:
  p: {{kind: pbs, job_root: /scratch/klique, user_map: {{alice: alice}}{pool_settings}}}
"""
    )
    context = Context(estate, Path("."), Path("klique-runner.pyz"), None)
    return PbsDriver(estate.pools["p"], context), sample_task(estate, "r")


def directive_lines(script):
    return [line for line in script.splitlines() if line.startswith("#PBS")]


def test_pbs_pro_directives_select_one_chunk():
    pbs, task = driver(", queue: gpu, account: proj-1")
    assert directive_lines(pbs.render(task)) == [
        "#PBS -N klique-0",
        "#PBS -q gpu",
        "#PBS -A proj-1",
        "#PBS -l select=1:ncpus=2:ngpus=1:mem=512mb",
        "#PBS -l walltime=01:30:00",
        "#PBS -j oe",
        "#PBS -o /scratch/klique/klique-0/pbs.out",
    ]


def test_torque_directives_ask_for_nodes_ppn_and_gpus():
    pbs, task = driver(", dialect: torque", "gpu_fraction: 0.5, cpus: 4, memory: 1G")
    assert directive_lines(pbs.render(task))[1:3] == [
        "#PBS -l nodes=1:ppn=4:gpus=1",  # a fraction of a GPU takes a whole one
        "#PBS -l mem=1024mb",
    ]


def test_torque_memory_of_a_multi_node_job_is_asked_per_process():
    # TORQUE 6.1 "Requesting resources": mem works only for single-node jobs; pmem otherwise.
    pbs, task = driver(", dialect: torque", "nodes: 2, cpus: 4, memory: 1G")
    assert directive_lines(pbs.render(task))[1:3] == [
        "#PBS -l nodes=2:ppn=4",
        "#PBS -l pmem=256mb",  # each node's 1024 MB over its 4 processes
    ]
    odd, task = driver(", dialect: torque", "nodes: 3, cpus: 3, memory: 1G")
    assert directive_lines(odd.render(task))[2] == "#PBS -l pmem=342mb"  # rounded up


def test_a_hostile_pool_setting_never_reaches_the_script():
    pbs, task = driver(", queue: 'gpu; touch /tmp/pwned'")
    with pytest.raises(TemplateError):
        pbs.render(task)


def test_status_names_the_pools_jobs_and_reads_through_unknown_ids():
    pbs, _ = driver()
    pbs._job_ids = {"alice": ["4325.pbs01", "9999"], "bob": ["4330.pbs01"]}
    assert pbs.status_argv(["alice"]) == ["qstat", "-x", "-f", "-F", "json", "4325.pbs01", "9999"]
    assert pbs.status_argv(["alice", "bob"])[-3:] == ["4325.pbs01", "9999", "4330.pbs01"]
    unknown = (PBS / "qstat_f_F_json_x_mixed.stderr").read_text()
    assert pbs.status_listed(Completed(153, "{}", unknown))
    finished = (PBS / "qstat_finished_without_x.stderr").read_text()
    assert pbs.status_listed(Completed(35, "{}", finished))
    assert pbs.status_listed(Completed(153, "", (TORQUE / "qstat_unknown.stderr").read_text()))
    down = "qstat: cannot connect to server pbs01 (errno=15010)\n"
    assert not pbs.status_listed(Completed(1, json.dumps({"pbs_server": "pbs01"}), down))


ARRAY_FOLDER = "/scratch/alice/klique/jobs/klique-60-0-0123456789ab"


def test_subjobs_without_job_history_show_their_state_not_the_arrays_exit_status():
    """qstat -t without job history: an ended subjob shows through its array (X, "Subjob
    finished", the array's Exit_status 1 though subjob 0 exited 0), so only the exit file can
    tell how it ended; the array's own record is no task's."""
    pbs, _ = driver()
    text = (PBS / "qstat_t_f_F_json_array.json").read_text()
    jobs = {s.native_id: s for s in parse_qstat_json(text)}
    assert (jobs["1000[0].pbs01"].state, jobs["1000[0].pbs01"].exit_code) == ("X/ended", None)
    assert jobs["1000[1].pbs01"].state == "X/failed"  # "Subjob failed": the exit file tells how
    assert (jobs["1000[2].pbs01"].state, jobs["1000[3].pbs01"].state) == ("R", "Q")
    assert {s.name for s in jobs.values()} == {"klique-array-60-0123456789ab"}
    assert {s.script for s in jobs.values()} == {f"{ARRAY_FOLDER}/job.sh"}
    assert {s.user for s in jobs.values()} == {"alice"}
    assert "X/ended" in pbs.SELF_ENDED and PBS_ALL_STATES["X/ended"].final
    assert sorted(s.native_id for s in pbs.parse_status(text)) == [
        f"1000[{n}].pbs01" for n in range(4)
    ]


def test_subjobs_with_job_history_show_their_own_exit():
    history = seen(parse_qstat_json((PBS / "qstat_x_t_f_F_json_array_history.json").read_text()))
    assert history["1000[0].pbs01"][1:] == ("X/completed", 0)
    assert history["1000[1].pbs01"][1:] == ("X/failed", 3)
    finished = (PBS / "qstat_x_t_f_F_json_array_finished.json").read_text()
    after = seen(parse_qstat_json(finished))
    assert after["1000[].pbs01"][1] == "F/completed"  # the array's: dropped by the driver
    assert after["1000[2].pbs01"][1:] == ("X/deleted", 143)  # qdel while it ran (substate 91)
    assert after["1000[3].pbs01"][1:] == ("X/completed", 0)


def test_run_count_says_how_often_a_job_was_requeued():
    """pbs_job_attributes(7B) run_count grows each time the job is sent to run: after qrerun
    of the array, subjob 1 waits again after one run (one requeue), subjob 0 runs its second
    run (one requeue); a job that never ran, a subjob shown through its array and Torque,
    which shows no run_count, say nothing."""
    rerun = {
        s.native_id: s
        for s in parse_qstat_json((PBS / "qstat_t_f_F_json_array_rerun.json").read_text())
    }
    assert (rerun["1000[1].pbs01"].state, rerun["1000[1].pbs01"].restarts) == ("Q", 1)
    assert (rerun["1000[0].pbs01"].state, rerun["1000[0].pbs01"].restarts) == ("R", 1)
    assert rerun["1000[].pbs01"].restarts is None  # the array's own record: never run itself
    history = {
        s.native_id: s.restarts
        for s in parse_qstat_json((PBS / "qstat_x_t_f_F_json_array_history.json").read_text())
    }
    assert history["1000[0].pbs01"] == 0 and history["1000[2].pbs01"] == 0  # ran once
    assert history["1000[3].pbs01"] is None  # queued, shown through the array
    ended = {
        s.native_id: s.restarts
        for s in parse_qstat_json((PBS / "qstat_t_f_F_json_array.json").read_text())
    }
    assert ended["1000[0].pbs01"] is None  # ended, shown through the array
    torque = parse_qstat_text((TORQUE / "qstat_f.txt").read_text(), TORQUE_EXEC_CODES)
    assert {s.restarts for s in torque} == {None}


def test_a_pbs_pro_sweep_is_one_array_named_once_in_status():
    pbs, _ = driver()
    assert pbs._uses_arrays() and pbs.ARRAY_INDEX == "PBS_ARRAY_INDEX"
    shared = ["#PBS -N {tag}", "#PBS -o {job_dir}/pbs.out"]
    assert pbs.array_directives(shared, 30) == [*shared, "#PBS -J 0-29"]
    assert pbs.element_id("1000[].pbs01", 3) == "1000[3].pbs01"
    assert [pbs.element_index(i) for i in ("1000[3].pbs01", "1000[].pbs01", "1000.pbs01")] == [
        3,
        None,
        None,
    ]
    assert parse_qsub("1000[].pbs01\n") == "1000[].pbs01"
    turned_off, _ = driver(", job_arrays: false")
    assert not turned_off._uses_arrays()
    assert not driver(", dialect: torque, job_arrays: false")[0]._uses_arrays()

    pbs._job_ids = {"alice": ["1000[].pbs01", "4325.pbs01"]}
    assert pbs.status_argv(["alice"]) == [
        *("qstat", "-x", "-t", "-f", "-F", "json"),
        *("1000[].pbs01", "4325.pbs01"),
    ]
    pbs._job_ids = {}  # a task whose submission's outcome is unknown: every job, subjobs too
    assert pbs.status_argv(["alice"]) == ["qstat", "-x", "-t", "-f", "-F", "json"]
    refused = Completed(0, "{}", (PBS / "qstat_x_history_off.stderr").read_text())
    assert pbs.status_again(["qstat", "-x", "-t", "-f", "-F", "json"], refused)
    assert pbs.status_argv(["alice"]) == ["qstat", "-t", "-f", "-F", "json"]
    gone = Completed(153, "{}", "qstat: Unknown Job Id 1000[].pbs01\n")  # an ended array
    assert pbs.status_listed(gone)


def test_a_torque_sweep_is_one_array_of_qsub_t_named_once_in_status():
    """TORQUE 6.1 "Job arrays": `#PBS -t 0-N`, each subjob's index in PBS_ARRAYID, ids as PBS
    Professional's; status names the array once with -t, which lists its subjobs."""
    torque, _ = driver(", dialect: torque")
    assert torque._uses_arrays() and torque.array_index == "PBS_ARRAYID"
    assert driver()[0].array_index == "PBS_ARRAY_INDEX"
    shared = ["#PBS -N {tag}", "#PBS -o {job_dir}/pbs.out"]
    assert torque.array_directives(shared, 30) == [*shared, "#PBS -t 0-29"]
    array = parse_qsub((TORQUE / "qsub_array.stdout").read_text())
    assert array == "2000[].tq-head.cluster.example.org"
    assert torque.element_id(array, 3) == "2000[3].tq-head.cluster.example.org"
    assert torque.element_index("2000[3].tq-head.cluster.example.org") == 3

    torque._job_ids = {"alice": [array, "2348.tq-head.cluster.example.org"]}
    assert torque.status_argv(["alice"]) == [
        *("qstat", "-t", "-f", "-1", array, "2348.tq-head.cluster.example.org")
    ]
    torque._job_ids = {"alice": ["2348.tq-head.cluster.example.org"]}
    assert torque.status_argv(["alice"]) == [
        *("qstat", "-f", "-1", "2348.tq-head.cluster.example.org")
    ]
    torque._job_ids = {}  # a task whose submission's outcome is unknown: every job, subjobs too
    assert torque.status_argv(["alice"]) == ["qstat", "-t", "-f", "-1"]


def test_torque_subjobs_read_as_jobs_named_as_their_array():
    """qstat -t -f -1 of an array: each subjob N[i] with its own state and exit status, its
    name the array's (job_clone's "-<index>" taken off); the summary without -t is no task's;
    an array the server no longer has leaves the other jobs listed."""
    torque, _ = driver(", dialect: torque")
    host = ".tq-head.cluster.example.org"
    subjobs = seen(torque.parse_status((TORQUE / "qstat_t_f_1_array.txt").read_text()))
    name = "klique-array-60-0123456789ab"
    assert subjobs == {
        f"2000[0]{host}": (name, "C/completed", 0),
        f"2000[1]{host}": (name, "C/failed", 3),
        f"2000[2]{host}": (name, "R", None),
        f"2000[3]{host}": (name, "R", None),
    }
    assert torque.parse_status((TORQUE / "qstat_f_1_array_summary.txt").read_text()) == []
    summary = parse_qstat_text((TORQUE / "qstat_f_1_array_summary.txt").read_text(), {})
    assert [(s.native_id, s.name) for s in summary] == [(f"2000[]{host}", name)]
    unknown = (TORQUE / "qstat_unknown_array.stderr").read_text()
    assert torque.status_listed(Completed(234, "", unknown))


def test_the_torque_servers_max_job_array_size_bounds_each_array():
    """TORQUE 6.1 "Server parameters" max_job_array_size, read from `qstat -B -f -1`; unset
    (no limit in Torque), Klique's own bound of 1000 holds."""
    shown = (TORQUE / "qstat_B_f_1.txt").read_text()
    unset = "".join(line for line in shown.splitlines(True) if "max_job_array_size" not in line)
    sizes = []
    for server in (shown, unset):
        torque, _ = driver(", dialect: torque")
        transport = ScriptedTransport(lambda argv, account, server=server: Completed(0, server, ""))
        torque.transport = transport
        asyncio.run(torque._read_server())
        sizes.append(torque.max_array)
        assert [argv for argv, _ in transport.calls] == [["qstat", "-B", "-f", "-1"]]
    assert sizes == [5000, 1000]
