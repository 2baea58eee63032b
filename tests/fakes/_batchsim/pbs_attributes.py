"""Job attributes as PBS Professional and Torque print them.

PBS Professional Reference Guide, pbs_job_attributes(7B) (Job_Name, Job_Owner,
job_state, Resource_List, Exit_status, comment, ...) and qstat(1B) "-F json" (attribute
output preceded by timestamp, pbs_version and pbs_server; resources nested);
OpenPBS src/cmds/qstat.c prt_attr() (long lines broken after commas, continued with a
tab) and display_statjob() (the default one-line format). TORQUE 6.1 "Job Exit Status"
shows the qstat -f layout (exit_status, comp_time, ...).
"""

from __future__ import annotations

import time

from .common import ctime, format_duration
from .flavors import pbs_exit_status
from .state import DONE, QUEUED, RUNNING

SUBSTATE = {"Q": 10, "H": 20, "R": 42}


def state_letter(job: dict) -> str:
    if job["state"] == QUEUED:
        return "H" if job.get("held") else "Q"
    if job["state"] == RUNNING:
        return "R"
    return "F" if job["flavor"] == "pbspro" else "C"


def _exec_vnode(job: dict, cfg: dict) -> str:
    parts = [cfg["host"], f"ncpus={job['ncpus']}"]
    if job["ngpus"]:
        parts.append(f"ngpus={job['ngpus']}")
    if job["mem_mb"]:
        parts.append(f"mem={job['mem_mb'] * 1024}kb")
    return "(" + ":".join(parts) + ")"


def _comment(job: dict, cfg: dict) -> str | None:
    if job["state"] == QUEUED and job.get("pending"):
        name, want, have, total = job["pending"]
        if name == "mem":
            want, have, total = (f"{v}mb" for v in (want, have, total))
        return (
            f"Not Running: Insufficient amount of resource: {name} (R: {want} A: {have} T: {total})"
        )
    if job["launch_time"] is None and job["start_time"] is None:
        return None
    started = time.strftime("%a %b %d at %H:%M", time.localtime(job["start_time"]))
    text = f"Job run at {started} on {_exec_vnode(job, cfg)}"
    if job["state"] == DONE:
        text += " and finished" if pbs_exit_status(job) == 0 else " and failed"
    return text


def _used(job: dict, now: float) -> dict:
    end = job["end_time"] or now
    return {
        "cpupercent": 0,
        "cput": "00:00:00",
        "mem": "0kb",
        "ncpus": job["ncpus"],
        "vmem": "0kb",
        "walltime": format_duration(end - job["launch_time"]),
    }


def _substate(job: dict) -> int:
    """OpenPBS svr_jobfunc.c, a job entering history: 91 (TERMINATED) after qdel, 93 (FAILED)
    for a non-zero exit status, 92 (FINISHED) otherwise."""
    letter = state_letter(job)
    if letter == "R" and job.get("requeue"):
        return 60  # JOB_SUBSTATE_RERUN: req_rerunjob2 while the MoM kills the run
    if letter != "F":
        return SUBSTATE[letter]
    if job["kill"] == "cancel":
        return 91
    if job.get("lost"):
        return 93  # its MoM went down: failed, whether or not an exit status is kept
    return 92 if pbs_exit_status(job) in (0, None) else 93


def _mtime(job: dict) -> float:
    return max(t for t in (job["submit_time"], job["start_time"], job["end_time"]) if t)


def pbspro(job: dict, cfg: dict, now: float, variables: dict) -> dict:
    """One job's attributes in the order qstat -f prints them (PBS Professional)."""
    native, host = job["native"], job["submit_host"]
    attrs: dict = {"Job_Name": job["name"], "Job_Owner": f"{job['owner']}@{host}"}
    if job["launch_time"]:
        attrs["resources_used"] = _used(job, now)
    attrs.update(job_state=state_letter(job), queue=job["queue"], server=cfg["server"])
    if job.get("account"):
        attrs["Account_Name"] = job["account"]
    attrs.update(
        Checkpoint="u", ctime=ctime(job["submit_time"]), Error_Path=f"{host}:{job['stderr']}"
    )
    if job["start_time"]:
        slots = f"*{job['ncpus']}" if job["ncpus"] > 1 else ""
        attrs.update(exec_host=f"{cfg['host']}/0{slots}", exec_vnode=_exec_vnode(job, cfg))
    attrs.update(
        Hold_Types="u" if job.get("held") else "n",
        Join_Path=job["join"] or "n",
        Keep_Files=native["keep"],
        Mail_Points=native["mail"],
        mtime=ctime(_mtime(job)),
        Output_Path=f"{host}:{job['stdout']}",
        Priority=native["priority"],
        qtime=ctime(job["submit_time"]),
        Rerunable="True" if native["rerunable"] else "False",
        Resource_List=native["resource_list"],
    )
    if job["start_time"]:
        attrs["stime"] = ctime(job["start_time"])
    if job["state"] == DONE:
        attrs["obittime"] = ctime(job["end_time"])
    if job["pid"]:
        attrs["session_id"] = job["pid"]
    attrs.update(jobdir=job["home"], substate=_substate(job), Variable_List=variables)
    comment = _comment(job, cfg)
    if comment:
        attrs["comment"] = comment
    attrs["etime"] = ctime(job["submit_time"])
    if job.get("run_count"):
        attrs["run_count"] = job["run_count"]  # each time the job was sent to run
    if job["state"] == DONE and pbs_exit_status(job) is not None:
        attrs["Exit_status"] = pbs_exit_status(job)
    elif job["state"] == QUEUED and job.get("requeued"):
        # JOB_EXEC_RERUN, which the MoM reported for the killed run: req_jobobit.c sets
        # Exit_status from it, and force_reque/on_job_rerun requeue the job with it still set.
        attrs["Exit_status"] = -11
    attrs["Submit_arguments"] = native["submit_args"]
    if job["state"] == DONE:
        attrs["history_timestamp"] = int(job["end_time"])
    attrs.update(project=job.get("project") or "_pbs_project_default", Submit_Host=host)
    return attrs


def flatten(attrs: dict) -> list[tuple[str, object]]:
    """Nested resources as 'Resource_List.ncpus' pairs, Variable_List as one k=v list."""
    pairs = []
    for name, value in attrs.items():
        if name == "Variable_List":
            pairs.append((name, ",".join(f"{k}={v}" for k, v in value.items())))
        elif isinstance(value, dict):
            pairs.extend((f"{name}.{k}", v) for k, v in value.items())
        else:
            pairs.append((name, value))
    return pairs


def torque(job: dict, cfg: dict, now: float, variables: dict) -> list[tuple[str, object]]:
    """One job's attributes in the order Torque's qstat -f prints them."""
    native, host = job["native"], job["submit_host"]
    pairs: list = [("Job_Name", job["name"]), ("Job_Owner", f"{job['owner']}@{host}")]
    if job["launch_time"]:
        used = _used(job, now)
        pairs += [
            ("resources_used.cput", "00:00:00"),
            ("resources_used.energy_used", 0),
            ("resources_used.mem", "0kb"),
            ("resources_used.vmem", "0kb"),
            ("resources_used.walltime", used["walltime"]),
        ]
    pairs += [("job_state", state_letter(job)), ("queue", job["queue"]), ("server", cfg["server"])]
    if job.get("account"):
        pairs.append(("Account_Name", job["account"]))
    pairs += [
        ("Checkpoint", "u"),
        ("ctime", ctime(job["submit_time"])),
        ("Error_Path", f"{host}:{job['stderr']}"),
    ]
    if job["start_time"]:
        slots = f"0-{job['ncpus'] - 1}" if job["ncpus"] > 1 else "0"
        pairs += [("exec_host", f"{cfg['host']}/{slots}"), ("exec_port", 15003)]
    pairs += [
        ("Hold_Types", "u" if job.get("held") else "n"),
        ("Join_Path", job["join"] or "n"),
        ("Keep_Files", native["keep"]),
        ("Mail_Points", native["mail"]),
        ("mtime", ctime(_mtime(job))),
        ("Output_Path", f"{host}:{job['stdout']}"),
        ("Priority", native["priority"]),
        ("qtime", ctime(job["submit_time"])),
        ("Rerunable", "True" if native["rerunable"] else "False"),
    ]
    pairs += [(f"Resource_List.{k}", v) for k, v in native["resource_list"].items()]
    if job["pid"]:
        pairs.append(("session_id", job["pid"]))
    pairs += [
        ("Variable_List", ",".join(f"{k}={v}" for k, v in variables.items())),
        ("euser", job["owner"]),
        ("egroup", job["group"]),
        ("queue_type", "E"),
        ("etime", ctime(job["submit_time"])),
    ]
    if job["state"] == DONE and pbs_exit_status(job) is not None:
        pairs.append(("exit_status", pbs_exit_status(job)))
    pairs.append(("submit_args", native["submit_args"]))
    if job.get("array"):  # a subjob's index (TORQUE job_clone), after submit_args as published
        pairs.append(("job_array_id", job["array"]["index"]))
    if job["start_time"]:
        pairs += [("start_time", int(job["start_time"])), ("start_count", 1)]
    pairs.append(("fault_tolerant", "False"))
    if job["state"] == DONE:
        pairs.append(("comp_time", int(job["end_time"])))
    pairs.append(("job_radix", 0))
    if job["state"] == DONE and job["launch_time"]:
        pairs.append(("total_runtime", f"{job['end_time'] - job['launch_time']:.6f}"))
    pairs += [("submit_host", host), ("init_work_dir", job["submit_cwd"]), ("request_version", 1)]
    return pairs


def attribute_line(name: str, value: str, one_line: bool) -> str:
    """OpenPBS prt_attr(): break after a comma before column 78, continue with a tab."""
    if one_line:
        return f"    {name} = {value}\n"
    out = [f"    {name} = "]
    start = len(name) + 7
    first = True
    tokens = [t for t in value.split(",") if t]
    for index, token in enumerate(tokens):
        if len(token) + start < 78:
            out.append(token)
            start += len(token)
        else:
            if not first:
                out.append("\n\t")
                start = 9
            for char in token:
                out.append(char)
                start += 1
                if start > 78:
                    start = 8
                    out.append("\n\t")
        if index < len(tokens) - 1:
            first = False
            out.append(",")
    return "".join(out) + "\n"


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "*"


def table(flavor: str, jobs: list[dict], cfg: dict, wide: bool) -> str:
    """The default one-line-per-job format (PBS Pro display_statjob; Torque qstat)."""
    if not jobs:
        return ""
    if flavor == "pbspro":
        id_w, name_w, user_w = (30, 15, 15) if wide else (16, 16, 16)
        lines = [
            f"{'Job id':<{id_w}}  {'Name':<{name_w}} {'User':<{user_w}}  Time Use S Queue",
            f"{'-' * id_w}  {'-' * name_w} {'-' * user_w}  -------- - -----",
        ]
        gap = "  "
    else:
        id_w, name_w, user_w = 25, 16, 15
        lines = [
            f"{'Job ID':<{id_w}} {'Name':<{name_w}} {'User':<{user_w}} Time Use S Queue",
            f"{'-' * id_w} {'-' * name_w} {'-' * user_w} -------- - -----",
        ]
        gap = " "
    for job in jobs:
        job_id = _cut(f"{job.get('shown', job['id'])}.{cfg['server']}", id_w)
        used = "00:00:00" if job["launch_time"] else "0"
        lines.append(
            f"{job_id:<{id_w}}{gap}{_cut(job['name'], name_w):<{name_w}} "
            f"{_cut(job['owner'], user_w):<{user_w}}{gap}{used:>8} "
            f"{job.get('letter') or state_letter(job)} {_cut(job['queue'], 16)}"
        )
    return "\n".join(lines) + "\n"
