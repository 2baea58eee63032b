"""What each scheduler does around a running job: its environment, its signals, its notes.

Sources, by flavor:
  pbspro  PBS Professional Reference Guide: qsub(1B) "ENVIRONMENT VARIABLES", qdel(1B)
          "Sequence of Events" (SIGTERM, then SIGKILL after kill_delay, to every process
          of the job's session: OpenPBS mom kill_session); job.h JOB_EXEC_KILL_WALLTIME
          (-29, from OpenPBS 22.05 / PBS Professional 2021.1; before, the job's own status
          after the SIGTERM); the MoM's stderr note
          "=>> PBS: job killed: walltime N exceeded limit M", written once the walltime
          used is past the limit (mom_main.c mom_over_limit).
  torque  TORQUE Administrator Guide 6.1, "Job Exit Status" (-11 exceeded walltime,
          271 = 256 + SIGTERM for a cancelled running job) and "Exported batch
          environment variables" (PBS_NUM_PPN, PBS_NP, PBS_GPUFILE, ...).
  lsf     IBM Spectrum LSF 10.1 "Environment variables set for job execution"
          (LSB_JOBID, LSB_HOSTS, LSB_MCPU_HOSTS, LSB_DJOB_NUMPROC, ...), bkill
          (SIGINT, SIGTERM, SIGKILL, JOB_TERMINATE_INTERVAL apart, to all of the job's
          processes), bsub -W ("the job is sent a SIGUSR2 signal, and is killed if it does
          not terminate within ten minutes", the kill as bkill's: "TERM_RUNLIMIT: job killed
          after reaching LSF run time limit").
"""

from __future__ import annotations

import math
import os
import signal
import time

from .state import job_hosts, shown_id

KILL_SEQUENCE = {
    ("pbspro", "cancel"): [signal.SIGTERM, signal.SIGKILL],
    ("pbspro", "walltime"): [signal.SIGTERM, signal.SIGKILL],
    ("torque", "cancel"): [signal.SIGTERM, signal.SIGKILL],
    ("torque", "walltime"): [signal.SIGTERM, signal.SIGKILL],
    ("lsf", "cancel"): [signal.SIGINT, signal.SIGTERM, signal.SIGKILL],
    ("lsf", "walltime"): [signal.SIGUSR2, signal.SIGINT, signal.SIGTERM, signal.SIGKILL],
    # qrerun: the MoM's terminate_job, as for qdel (OpenPBS resmom/requests.c, SIG_RERUN);
    # brequeue: SIG_KILL_REQUEUE is bkill's SIG_TERM_USER (volclava lsbatch/daemons/sbd.sig.c).
    ("pbspro", "requeue"): [signal.SIGTERM, signal.SIGKILL],
    ("lsf", "requeue"): [signal.SIGINT, signal.SIGTERM, signal.SIGKILL],
    # lsb.queues TERMINATE_WHEN=PREEMPT: the job's TERMINATE action, bkill's sequence by
    # default (IBM Spectrum LSF 10.1, "Configuring job controls"); it ends EXIT, TERM_PREEMPT.
    ("lsf", "preempt"): [signal.SIGINT, signal.SIGTERM, signal.SIGKILL],
}


def preemption_due(job: dict, cfg: dict) -> float | None:
    """When an LSF job is preempted by a job of a higher-priority queue: its start plus
    KLIQUE_SIM_LSF_PREEMPT_AFTER seconds (None: never), the simulator's stand-in for a
    preemptive queue's job arriving."""
    after = cfg.get("preempt_after")
    if job["flavor"] != "lsf" or not after or job["launch_time"] is None:
        return None
    return job["launch_time"] + after


def next_delay(job: dict, cfg: dict) -> float:
    """Seconds before the next signal of the job's kill sequence: LSF's run-limit grace after
    the SIGUSR2, the kill delay (PBS kill_delay, LSF JOB_TERMINATE_INTERVAL) otherwise."""
    if job["flavor"] == "lsf" and job["kill"] == "walltime" and job["kill_steps"] == 1:
        return cfg["runlimit_grace"]
    return cfg["kill_delay"]


def walltime_deadline(job: dict) -> float:
    """When the execution host ends a job for its walltime: LSF at the run limit; a PBS MoM
    once the whole seconds used exceed the limit (mom_over_limit: used > limit)."""
    extra = 0 if job["flavor"] == "lsf" else 1
    return job["launch_time"] + job["walltime"] + extra


def kills_walltime_with_a_code(cfg: dict) -> bool:
    """Whether this PBS Professional reports a walltime kill as JOB_EXEC_KILL_WALLTIME: from
    PBS Professional 2021.1 (year-numbered) and OpenPBS 22.05 (two-digit years)."""
    head = str(cfg["pbs_version"]).split(".", 1)[0]
    major = int(head) if head.isdigit() else 0
    return major >= 2021 or 22 <= major < 100


def full_id(job: dict, cfg: dict) -> str:
    return shown_id(job) if job["flavor"] == "lsf" else f"{shown_id(job)}.{cfg['server']}"


def tmpdir_name(job: dict, cfg: dict) -> str:
    if job["flavor"] == "lsf":
        return f"{job['id']}.tmpdir"
    return f"pbs.{full_id(job, cfg)}" if job["flavor"] == "pbspro" else full_id(job, cfg)


def _pbspro_env(job: dict, cfg: dict, files: dict) -> dict:
    env = {
        "PBS_JOBID": full_id(job, cfg),
        "PBS_JOBNAME": job["name"],
        "PBS_QUEUE": job["queue"],
        "PBS_NODEFILE": files["nodefile"],
        "PBS_ENVIRONMENT": "PBS_BATCH",
        "PBS_JOBDIR": job["home"],
        "PBS_TASKNUM": "1",
        "PBS_NODENUM": "0",
        "PBS_MOMPORT": "15003",
        "PBS_JOBCOOKIE": os.urandom(16).hex().upper(),
        "TMPDIR": files["tmpdir"],
        "NCPUS": str(job["ncpus"]),
        "OMP_NUM_THREADS": str(job["ncpus"]),
    }
    if job.get("account"):
        env["PBS_ACCOUNT"] = job["account"]
    if job.get("array"):  # a subjob (qsub(1B) -J, "ENVIRONMENT VARIABLES")
        env["PBS_ARRAY_INDEX"] = str(job["array"]["index"])
        env["PBS_ARRAY_ID"] = f"{job['array']['id']}[].{cfg['server']}"
    return env


def _torque_env(job: dict, cfg: dict, files: dict) -> dict:
    native = job["native"]
    env = {
        "PBS_JOBID": full_id(job, cfg),
        "PBS_JOBNAME": job["name"],
        "PBS_QUEUE": job["queue"],
        "PBS_NODEFILE": files["nodefile"],
        "PBS_GPUFILE": files["gpufile"],
        "PBS_ENVIRONMENT": "PBS_BATCH",
        "ENVIRONMENT": "BATCH",
        "PBS_TASKNUM": "1",
        "PBS_NODENUM": "0",
        "PBS_VNODENUM": "0",
        "PBS_MOMPORT": "15003",
        "PBS_NUM_NODES": str(native.get("nodes", 1)),
        "PBS_NUM_PPN": str(native.get("ppn", 1)),
        "PBS_NP": str(job["ncpus"]),
        "PBS_SERVER": cfg["server"],
        "PBS_VERSION": "TORQUE-6.1.3",
        "PBS_JOBCOOKIE": os.urandom(16).hex().upper(),
        "TMPDIR": files["tmpdir"],
    }
    if job["walltime"] is not None:
        env["PBS_WALLTIME"] = str(job["walltime"])
    return env


def _lsf_env(job: dict, cfg: dict, files: dict) -> dict:
    slots = job["ncpus"]
    given = host_slots(job, cfg)
    env = {
        # An array's element: its array's number, and its index (0 outside an array).
        "LSB_JOBID": str(job["array"]["id"] if job.get("array") else job["id"]),
        "LSB_BATCH_JID": shown_id(job),
        "LSB_JOBINDEX": str(job["array"]["index"] if job.get("array") else 0),
        "LSB_JOBNAME": job["name"],
        "LSB_QUEUE": job["queue"],
        "LSB_HOSTS": " ".join(host for host, count in given for _ in range(count)),
        "LSB_MCPU_HOSTS": " ".join(f"{host} {count}" for host, count in given),
        "LSB_DJOB_NUMPROC": str(slots),
        "LSB_MAX_NUM_PROCESSORS": str(slots),
        "LSB_DJOB_HOSTFILE": files["nodefile"],
        "LSB_EXEC_CLUSTER": cfg["cluster"],
        "LSB_JOB_EXECUSER": job["owner"],
        "LSFUSER": job["owner"],
        "LSB_SUB_HOST": job["submit_host"],
        "LS_SUBCWD": job["submit_cwd"],
        "LSB_JOBFILENAME": files["script"],
        "LSB_UNIXGROUP_INT": job["group"],
        "TMPDIR": files["tmpdir"],
    }
    if job["native"].get("output_file"):
        env["LSB_OUTPUTFILE"] = job["native"]["output_file"]
    if job["native"].get("error_file"):
        env["LSB_ERRORFILE"] = job["native"]["error_file"]
    if job.get("project"):
        env["LSB_PROJECT_NAME"] = job["project"]
    return env


def runtime_env(job: dict, cfg: dict, files: dict) -> dict:
    """Variables the execution host adds when the job starts (GPUs, nodes, scratch)."""
    env = {"pbspro": _pbspro_env, "torque": _torque_env, "lsf": _lsf_env}[job["flavor"]](
        job, cfg, files
    )
    if job["gpus"]:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in job["gpus"])
    return env


def node_lines(job: dict, cfg: dict) -> list[str]:
    """$PBS_NODEFILE: one line per MPI rank (PBS Pro: per chunk's mpiprocs, default 1;
    Torque: per ppn), host by host; $LSB_DJOB_HOSTFILE: one line per slot."""
    return [host for host, count in host_slots(job, cfg) for _ in range(count)]


def host_slots(job: dict, cfg: dict) -> list[tuple[str, int]]:
    """Each host the job was given, with its lines in the node file (LSF: its slots)."""
    hosts = job_hosts(job, cfg)
    if job["flavor"] == "pbspro":
        total = job["native"].get("mpiprocs", 1)
    elif job["flavor"] == "torque":
        total = job["ncpus"]
    else:  # LSF: span[ptile=K] fills each host with K slots, the last with the rest
        ptile = job["native"].get("ptile") or job["ncpus"]
        left = job["ncpus"]
        found = []
        for host in hosts:
            found.append((host, min(ptile, left)))
            left -= ptile
        return found
    each = max(1, total // len(hosts))
    return [(host, each) for host in hosts]


def with_commands(path: str | None, job: dict) -> str:
    """The job's PATH with the scheduler's own commands at its end (pbsdsh, blaunch), as an
    execution host has them (PBS_EXEC/bin, LSF_BINDIR)."""
    folder = os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), job["flavor"]
    )
    return f"{path}:{folder}" if path else folder


def walltime_note(job: dict, now: float) -> str | None:
    """The line the MoM appends to the job's stderr when it kills it for walltime."""
    if job["flavor"] == "lsf":
        return None
    used = math.ceil(now - (job["launch_time"] or now))
    return f"=>> PBS: job killed: walltime {used} exceeded limit {job['walltime']}\n"


def lsf_report(job: dict, cfg: dict, script_text: str) -> str:
    """The job report LSF appends to the -o file (or mails) when a job ends."""
    name, fid = job["name"], shown_id(job)
    if job["kill"] == "walltime":
        outcome = (
            "TERM_RUNLIMIT: job killed after reaching LSF run time limit.\n"
            f"Exited with exit code {lsf_exit_code(job)}."
        )
    elif job["kill"] == "cancel":
        outcome = f"TERM_OWNER: job killed by owner.\nExited with exit code {lsf_exit_code(job)}."
    elif job["kill"] == "preempt":
        outcome = (
            "TERM_PREEMPT: job killed after preemption.\n"
            f"Exited with exit code {lsf_exit_code(job)}."
        )
    elif lsf_exit_code(job) == 0:
        outcome = "Successfully completed."
    else:
        outcome = f"Exited with exit code {lsf_exit_code(job)}."
    status = "Done" if lsf_exit_code(job) == 0 and not job["kill"] else "Exited"
    lines = [
        "",
        "-" * 60,
        f"Sender: LSF System <lsfadmin@{cfg['host']}>",
        f"Subject: Job {fid}: <{name}> in cluster <{cfg['cluster']}> {status}",
        "",
        f"Job <{name}> was submitted from host <{job['submit_host']}> by user "
        f"<{job['owner']}> in cluster <{cfg['cluster']}> at {time.ctime(job['submit_time'])}",
        f"Job was executed on host(s) <{_lsf_exec_hosts(job, cfg)}>, in queue <{job['queue']}>,"
        f" as user <{job['owner']}> in cluster <{cfg['cluster']}> at "
        f"{time.ctime(job['launch_time'] or job['submit_time'])}",
        f"<{job['home']}> was used as the home directory.",
        f"<{job['workdir']}> was used as the working directory.",
        f"Started at {time.ctime(job['launch_time'] or job['submit_time'])}",
        f"Terminated at {time.ctime(job['end_time'])}",
        f"Results reported at {time.ctime(job['end_time'])}",
        "",
        "Your job looked like:",
        "",
        "-" * 60,
        "# LSBATCH: User input",
        script_text.rstrip("\n"),
        "-" * 60,
        "",
        outcome,
        "",
        "Resource usage summary:",
        "",
        f"    Run time :                                   "
        f"{int(job['end_time'] - (job['launch_time'] or job['end_time']))} sec.",
        f"    Total Requested Memory :                     "
        f"{str(job['mem_mb']) + ' MB' if job['mem_mb'] else '-'}",
        "",
    ]
    return "\n".join(lines) + "\n"


def _lsf_exec_hosts(job: dict, cfg: dict) -> str:
    return f"{job['ncpus']}*{cfg['host']}" if job["ncpus"] > 1 else cfg["host"]


def lsf_exit_code(job: dict) -> int | None:
    """EXIT_CODE as bjobs reports it: the exit value, or 128 + the signal that ended it."""
    if job["signal"]:
        return 128 + job["signal"]
    return job["exit_code"]


def pbs_exit_status(job: dict) -> int | None:
    """Exit_status (PBS Pro) / exit_status (Torque) of a finished job.

    A job killed by a signal reports 256 + the signal (271 for SIGTERM); a walltime
    kill reports JOB_EXEC_KILL_WALLTIME (-29, PBS Pro from 2021.1, kept as limit_code; before,
    the job's own status) or JOB_EXEC_OVERLIMIT_WT (-11, Torque 6); a job deleted before it
    ran has none.
    """
    if job["kill"] == "walltime" and job["flavor"] == "torque":
        return -11
    if job["kill"] == "walltime" and job.get("limit_code") is not None:
        return job["limit_code"]
    if job["launch_time"] is None and job.get("lost") is None:
        return None
    if job.get("lost"):
        # The MoM went down under the job. One that may not rerun (qsub -r n) is discarded:
        # it enters history failed (substate 93) with no Exit_status at all (OpenPBS
        # req_jobobit.c, discard_job); -3 (JOB_EXEC_RETRY) otherwise.
        return -3 if job["native"].get("rerunable", True) else None
    if job["signal"]:
        return 256 + job["signal"]
    return job["exit_code"]


def owned_files(job: dict, sim_tmp: str, cfg: dict, job_dir: str) -> dict:
    """Where the execution host writes a job's node file, GPU file, script and TMPDIR."""
    return {
        "nodefile": os.path.join(job_dir, "nodefile"),
        "gpufile": os.path.join(job_dir, "gpufile"),
        "script": os.path.join(job_dir, "script"),
        "tmpdir": os.path.join(sim_tmp, tmpdir_name(job, cfg)),
    }
