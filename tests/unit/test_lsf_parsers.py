"""IBM Spectrum LSF: the parsers on captured bsub/bjobs output, the state table, the directives
and the script they make."""

from pathlib import Path

import pytest

from broker.domain import TaskState
from broker.errors import SubmitError, TemplateError, TransportError
from broker.estate import parse_estate
from broker.pools.arrays import shared_directives
from broker.pools.base import Context
from broker.pools.lsf import (
    LSF_ALL_STATES,
    LsfDriver,
    parse_bjobs_json,
    parse_bjobs_text,
    parse_bsub,
    run_limit_minutes,
)
from broker.preview import sample_task
from broker.transport import Completed

DATA = Path(__file__).resolve().parents[1] / "data" / "lsf"


def seen(statuses):
    return {s.native_id: (s.name, s.state, s.exit_code) for s in statuses}


def test_bsub_prints_the_job_id():
    assert parse_bsub((DATA / "bsub.stdout").read_text()) == "5613"
    assert parse_bsub((DATA / "bsub_default_queue.stdout").read_text()) == "5614"


@pytest.mark.parametrize("name", ["bsub_unknown_queue.stderr", "bsub_too_many_processors.stderr"])
def test_a_refusal_is_a_submit_error(name):
    with pytest.raises(SubmitError):
        parse_bsub((DATA / name).read_text())


def test_bjobs_json_gives_every_job_its_state_and_exit():
    jobs = seen(parse_bjobs_json((DATA / "bjobs_o_json_a.json").read_text()))
    assert jobs == {
        "5601": ("klique-81", "PEND", None),
        "5602": ("klique-82", "PSUSP", None),
        "5603": ("klique-83", "RUN", None),
        "5604": ("klique-84", "USUSP", None),
        "5605": ("klique-85", "SSUSP", None),
        "5606": ("klique-86", "DONE", None),
        "5607": ("klique-87", "EXIT", 1),
        "5608": ("klique-88", "EXIT/TERM_RUNLIMIT", 140),
        "5609": ("klique-89", "EXIT/TERM_OWNER", 130),
        "5610": ("klique-90", "EXIT/TERM_OWNER", None),
        "5611": ("klique-91", "UNKWN", None),
        "5612": ("klique-92", "ZOMBI", None),
    }
    states = {k: LSF_ALL_STATES[state] for k, (_, state, _) in jobs.items()}
    assert states["5602"] is TaskState.PENDING
    assert states["5605"] is TaskState.RUNNING
    assert states["5608"] is TaskState.TIMEOUT
    assert states["5609"] is states["5610"] is TaskState.CANCELLED
    assert states["5612"] is TaskState.LOST


def test_pending_and_suspended_jobs_carry_lsfs_reason():
    jobs = {s.native_id: s for s in parse_bjobs_json((DATA / "bjobs_o_json_a.json").read_text())}
    assert jobs["5601"].reason == "Not enough GPU resources"
    assert jobs["5605"].reason.startswith("The job was suspended by LSF because the load")


def test_an_unknown_job_is_an_error_record_and_is_left_out():
    jobs = seen(parse_bjobs_json((DATA / "bjobs_o_json_found_and_missing.json").read_text()))
    assert list(jobs) == ["5603"]
    assert parse_bjobs_json((DATA / "bjobs_o_json_all_missing.json").read_text()) == []
    assert parse_bjobs_json((DATA / "bjobs_o_json_no_jobs.json").read_text()) == []


def test_the_field_list_psij_polls_with_parses_too():
    jobs = seen(parse_bjobs_json((DATA / "bjobs_o_json_reasons.json").read_text()))
    assert {state for _, state, _ in jobs.values()} <= set(LSF_ALL_STATES)
    assert jobs["5608"][1] == "EXIT/TERM_RUNLIMIT"


def test_a_run_limit_kill_without_a_reason_is_told_by_its_exit_code():
    text = '{"RECORDS": [{"JOBID": "7", "STAT": "EXIT", "EXIT_CODE": "140", "EXIT_REASON": ""}]}'
    assert seen(parse_bjobs_json(text)) == {"7": ("", "EXIT/TERM_RUNLIMIT", 140)}


@pytest.mark.parametrize(("seconds", "minutes"), [(5, 1), (60, 1), (61, 2), (5400, 90)])
def test_the_run_limit_is_whole_minutes_rounded_up(seconds, minutes):
    assert run_limit_minutes(seconds) == minutes


def driver(pool_settings="", profile="gpus: 2, cpus: 3, memory: 100M, walltime: 90s"):
    estate = parse_estate(
        f"""
resources:
  r:
    profile: {{pools: [p], {profile}}}
pools:
  p: {{kind: lsf, job_root: /scratch/klique, user_map: {{alice: alice}}{pool_settings}}}
"""
    )
    context = Context(estate, Path("."), Path("klique-runner.pyz"), None)
    return LsfDriver(estate.pools["p"], context), sample_task(estate, "r")


def test_directives_carry_slots_memory_gpus_and_the_run_limit():
    lsf, task = driver(", queue: gpu, account: proj-1")
    lines = [line for line in lsf.render(task).splitlines() if line.startswith("#BSUB")]
    assert lines == [
        "#BSUB -J klique-0",
        "#BSUB -Jd klique-0",
        "#BSUB -q gpu",
        "#BSUB -P proj-1",
        "#BSUB -n 3",
        '#BSUB -R "span[hosts=1]"',
        '#BSUB -R "rusage[mem=100MB]"',
        '#BSUB -gpu "num=2"',
        "#BSUB -W 2",
        "#BSUB -o /scratch/klique/klique-0/lsf-%J.out",
    ]


def test_a_hostile_pool_setting_never_reaches_the_script():
    lsf, task = driver(", account: '$(touch /tmp/pwned)'")
    with pytest.raises(TemplateError):
        lsf.render(task)


def test_the_script_goes_to_bsub_on_standard_input_as_data():
    lsf, _ = driver()
    assert lsf.submit_argv("/scratch/klique/klique-0/job.sh") == ["bsub"]
    assert lsf.SUBMIT_STDIN  # the transport feeds it job.sh: `bsub < job.sh`


def test_status_asks_for_the_pools_accounts_and_reads_an_empty_answer():
    lsf, _ = driver()
    assert lsf.status_argv(["alice"])[-2:] == ["-u", "alice"]
    assert lsf.status_argv(["alice", "bob"])[-2:] == ["-u", "all"]
    empty = (DATA / "bjobs_o_json_no_jobs.json").read_text()
    assert lsf.status_listed(Completed(255, empty, ""))
    assert not lsf.status_listed(Completed(255, "", "LSF is down. Please wait ...\n"))


def test_status_names_the_pools_jobs_by_id_and_reads_through_unknown_ids():
    """bjobs(1) job_ID: the pool's jobs, an array by its number (every element), rather than
    -u all of the whole cluster; a named job LSF no longer knows is said on stderr (255)."""
    lsf, _ = driver()
    lsf._job_ids = {"alice": ["3001", "3000"], "bob": ["3002"]}
    assert lsf.status_argv(["alice", "bob"])[-3:] == ["3001", "3000", "3002"]
    assert "-u" not in lsf.status_argv(["alice", "bob"])
    text, _ = driver(", bjobs_json: false")
    unknown = (DATA / "bjobs_unknown.stderr").read_text()
    assert text.status_listed(Completed(255, "", unknown))


def test_lines_lsf_prints_before_the_json_are_passed_over():
    text = (DATA / "bjobs_o_json_please_wait.json").read_text()
    assert text.startswith("Cannot connect to LSF. Please wait ...")
    assert seen(parse_bjobs_json(text)) == {"12345678": ("", "EXIT/TERM_OWNER", None)}
    lsf, _ = driver()
    assert lsf.status_listed(Completed(0, text, ""))


def test_a_published_done_record_reads():
    jobs = seen(parse_bjobs_json((DATA / "bjobs_o_json_batcheuphoria.json").read_text()))
    assert jobs == {"22005": ("ls -l", "DONE", None)}


def test_a_record_without_stat_is_unreadable_and_the_others_read():
    text = (
        '{"RECORDS": [{"JOBID": "7", "STAT": "RUN", "JOB_NAME": "klique-7"},'
        ' {"JOBID": "8", "JOB_NAME": "klique-8"}, {"STAT": "RUN"}]}'
    )
    statuses = {s.native_id: s for s in parse_bjobs_json(text)}
    assert set(statuses) == {"7", "8"}
    assert statuses["7"].state == "RUN" and statuses["8"].problem.startswith("no STAT")


@pytest.mark.parametrize("exit_status", [0, 255])  # LSB_BJOBS_CONSISTENT_EXIT_CODE N (default), Y
def test_nothing_to_show_is_an_empty_listing_whatever_the_exit_code(exit_status):
    lsf, _ = driver()
    empty = (DATA / "bjobs_o_json_no_jobs.json").read_text()
    assert lsf._listing(Completed(exit_status, empty, "")) == []
    text, _ = driver(", bjobs_json: false")
    none = (DATA / "bjobs_none.stderr").read_text()
    assert text._listing(Completed(exit_status, "", none)) == []
    with pytest.raises(TransportError):
        text._listing(Completed(255, "", "LSF is down. Please wait ...\n"))


def test_lsf_without_json_is_read_from_delimited_text():
    lsf, _ = driver(", bjobs_json: false")
    argv = lsf.status_argv(["alice"])
    assert argv[:3] == ["bjobs", "-a", "-o"] and argv[3].endswith(" delimiter='^'")
    assert "-json" not in argv
    jobs = seen(lsf.parse_status((DATA / "bjobs_o_delimited.txt").read_text()))
    full = seen(parse_bjobs_json((DATA / "bjobs_o_json_a.json").read_text()))
    assert set(jobs) == {"5601", "5603", "5606", "5607", "5608", "5609"}
    assert jobs == {job_id: full[job_id] for job_id in jobs}  # the text reads as the JSON does
    [short] = lsf.parse_status("5610^RUN^alice\n")
    assert short.native_id == "5610" and short.problem


def test_an_lsf_without_json_is_named_with_the_version_it_needs():
    lsf, _ = driver()
    refused = Completed(255, "", "bjobs: illegal option -- j\nUsage: bjobs [-h] [-V] ...\n")
    with pytest.raises(TransportError) as caught:
        lsf.status_listed(refused)
    words = str(caught.value)
    assert "10.1 Fix Pack 2" in words and "bjobs_json: false" in words and "'p'" in words


ARRAY = "klique-array-81-0123456789ab"


@pytest.mark.parametrize("name", ["bjobs_o_json_array.json", "bjobs_o_delimited_array.txt"])
def test_each_element_of_an_array_is_its_own_job_named_as_the_array(name):
    """bjobs lists an array's elements one a line under the array's number, with JOBINDEX and
    the name `<array>[index]`: each becomes `number[index]`, the id bkill takes, named as the
    array; a job outside an array (index 0) keeps its id and name."""
    text = (DATA / name).read_text()
    parse = parse_bjobs_json if name.endswith(".json") else parse_bjobs_text
    jobs = {s.native_id: s for s in parse(text)}
    assert seen(jobs.values()) == {
        "5620[1]": (ARRAY, "RUN", None),
        "5620[2]": (ARRAY, "EXIT", 3),
        "5620[3]": (ARRAY, "EXIT/TERM_RUNLIMIT", 140),
        "5620[4]": (ARRAY, "EXIT/TERM_OWNER", 130),
        "5620[5]": (ARRAY, "DONE", None),
        "5620[6]": (ARRAY, "PEND", None),
        "5621": ("klique-95", "RUN", None),
        "5622[2]": ("sweep", "PEND", None),  # JOBID with its index (LSB_BJOBS_DISPLAY_ENH=Y)
    }
    assert LSF_ALL_STATES[jobs["5620[3]"].state] is TaskState.TIMEOUT
    assert jobs["5620[6]"].reason == "Not enough job slot(s)"
    assert (jobs["5620[1]"].user, jobs["5622[2]"].user) == ("alice", "bob")


def test_an_older_listing_without_the_index_reads_by_its_header():
    """The header names the fields: a listing without JOBINDEX still reads, as jobs."""
    jobs = seen(parse_bjobs_text((DATA / "bjobs_o_delimited.txt").read_text()))
    assert jobs["5608"] == ("klique-88", "EXIT/TERM_RUNLIMIT", 140)
    assert len(jobs) == 6


def test_an_arrays_directives_name_it_with_its_indices_and_give_each_element_its_output():
    """bsub -J "name[1-N]" makes the array; %I (the element's index) next to %J (the array's
    number) gives each element its own LSF output file; elements are N[i] for bkill."""
    lsf, task = driver(", queue: gpu")
    job_dir = "/scratch/klique/klique-0-1-000000000000"
    shared = shared_directives(lsf.render(task, job_dir), "#BSUB", job_dir, task.tag)
    lines = lsf.array_directives(shared, 30)
    assert lines[0] == '#BSUB -J "{tag}[1-30]"'
    assert "#BSUB -Jd {tag}" in lines and "#BSUB -J {tag}" not in lines
    assert "#BSUB -o {job_dir}/lsf-%J.%I.out" in lines
    assert [line.replace("%J.%I", "%J") for line in lines[1:]] == [
        line for line in shared if line != "#BSUB -J {tag}"
    ]
    assert (lsf.MAX_ARRAY, lsf.ARRAY_FIRST, lsf.ARRAY_INDEX) == (1000, 1, "LSB_JOBINDEX")
    assert lsf.element_id("5620", 3) == "5620[3]"
    assert lsf.cancel_argv("5620[3]") == ["bkill", "5620[3]"]
    assert [lsf.element_index(i) for i in ("5620[3]", "5620", "5620_3")] == [3, None, None]


def test_an_elements_unreadable_record_keeps_the_elements_id():
    """A record without STAT is unreadable: an element's is kept by the element's id, so its
    task waits for the next listing instead of being taken for gone."""
    text = '{"RECORDS": [{"JOBID": "5620", "JOBINDEX": "4", "JOB_NAME": "a[4]", "STAT": ""}]}'
    [status] = parse_bjobs_json(text)
    assert (status.native_id, bool(status.problem)) == ("5620[4]", True)
