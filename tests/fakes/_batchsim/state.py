"""The simulated server: one JSON file of jobs under an flock, shared by every user.

Layout of a state folder ($KLIQUE_SIM_DIR/<flavor>, world-writable):
    lock                  flock(2) target; writers hold LOCK_EX, readers LOCK_SH
    state.json            {"next_id", "config", "jobs": {"<seq>": job}} replaced atomically
    jobs/<seq>/           the job's copy of its script, environment, node and GPU files
    supervisor-<uid>.lock held by the one supervisor process of that user
    tmp/                  per-job TMPDIR folders
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import json
import os
import time
from collections.abc import Iterator

from .common import env_float, env_int, parse_size, short_host

DEFAULT_QUEUES = {"pbspro": "workq", "torque": "batch", "lsf": "normal"}
FIRST_ID = {"pbspro": 1000, "torque": 2000, "lsf": 3000}

# Generic job states; each flavor maps them to its own letters/words on output.
QUEUED, RUNNING, DONE = "queued", "running", "done"
_SEPARATORS = (",", ":")


# On/off server settings (tests/fakes/README.md, "The settings sites change"): variable ->
# config key.
_SWITCHES = {
    "KLIQUE_SIM_JOB_HISTORY_ENABLE": "job_history_enable",
    "KLIQUE_SIM_QUERY_OTHER_JOBS": "query_other_jobs",
    "KLIQUE_SIM_BJOBS_CONSISTENT_EXIT_CODE": "bjobs_consistent_exit_code",
}
_TRUE = {"1", "y", "yes", "t", "true"}
# The vendor's default of each setting (PBS Professional 2022 Reference Guide, "Server
# Attributes": job_history_enable false; OpenPBS pbsd_init.c: query_other_jobs true; TORQUE
# 6.1 "Server parameters": query_other_jobs false; IBM Spectrum LSF 10.1 lsf.conf:
# LSB_BJOBS_CONSISTENT_EXIT_CODE=N; bsub -W: SIGUSR2, then the kill ten minutes later; lsb.params
# MAX_JOB_ARRAY_SIZE=1000).
VENDOR_DEFAULTS = {
    "pbspro": {"job_history_enable": False, "query_other_jobs": True},
    # TORQUE 6.1 "Server parameters": max_job_array_size unset (no limit).
    "torque": {"job_history_enable": False, "query_other_jobs": False, "max_job_array_size": None},
    "lsf": {
        "bjobs_consistent_exit_code": False,
        "runlimit_grace": 600.0,
        "max_job_array_size": 1000,
        "preempt_after": None,
        # IBM Spectrum LSF 10.1 Configuration Reference, lsb.params SECURE_JOB_INFO_LEVEL:
        # 0 by default, every user sees every job.
        "secure_job_info_level": 0,
    },
}
PBS_VERSION = "2022.1.3.20230614134139"


def _config_from_env() -> dict:
    """Server settings the environment names explicitly (others keep their stored value)."""
    env = os.environ
    found: dict = {}
    for name, key in _SWITCHES.items():
        if env.get(name):
            found[key] = env[name].strip().lower() in _TRUE
    if env.get("KLIQUE_SIM_PBS_VERSION"):
        found["pbs_version"] = env["KLIQUE_SIM_PBS_VERSION"].strip()
    if env.get("KLIQUE_SIM_LSF_RUNLIMIT_GRACE"):
        found["runlimit_grace"] = env_float("KLIQUE_SIM_LSF_RUNLIMIT_GRACE", 600.0)
    if env.get("KLIQUE_SIM_LSF_PREEMPT_AFTER"):
        found["preempt_after"] = env_float("KLIQUE_SIM_LSF_PREEMPT_AFTER", 0.0) or None
    if env.get("KLIQUE_SIM_LSF_SECURE_JOB_INFO_LEVEL"):
        found["secure_job_info_level"] = env_int("KLIQUE_SIM_LSF_SECURE_JOB_INFO_LEVEL", 0)
    if env.get("KLIQUE_SIM_LSF_MAX_JOB_ARRAY_SIZE"):
        found["max_job_array_size"] = env_int("KLIQUE_SIM_LSF_MAX_JOB_ARRAY_SIZE", 1000)
    if env.get("KLIQUE_SIM_TORQUE_MAX_JOB_ARRAY_SIZE"):
        found["max_job_array_size"] = env_int("KLIQUE_SIM_TORQUE_MAX_JOB_ARRAY_SIZE", 0)
    if env.get("KLIQUE_SIM_GPUS"):
        found["gpus"] = env_int("KLIQUE_SIM_GPUS", 4)
    if env.get("KLIQUE_SIM_CPUS"):
        found["cpus"] = env_int("KLIQUE_SIM_CPUS", 16)
    if env.get("KLIQUE_SIM_MEM"):
        found["mem_mb"] = parse_size(env["KLIQUE_SIM_MEM"], "mb") // (1024 * 1024)
    if env.get("KLIQUE_SIM_KEEP"):
        found["keep"] = env_float("KLIQUE_SIM_KEEP", 300.0)
    if env.get("KLIQUE_SIM_KILL_DELAY"):
        found["kill_delay"] = env_float("KLIQUE_SIM_KILL_DELAY", 10.0)
    if env.get("KLIQUE_SIM_QUEUES"):
        found["queues"] = [q.strip() for q in env["KLIQUE_SIM_QUEUES"].split(",") if q.strip()]
    if env.get("KLIQUE_SIM_LSF_MINUTE"):
        found["lsf_minute"] = env_float("KLIQUE_SIM_LSF_MINUTE", 60.0)
    if env.get("KLIQUE_SIM_SERVER"):
        found["server"] = env["KLIQUE_SIM_SERVER"]
    if env.get("KLIQUE_SIM_HOST"):
        found["host"] = env["KLIQUE_SIM_HOST"]
    if env.get("KLIQUE_SIM_NODES"):
        found["nodes"] = env_int("KLIQUE_SIM_NODES", 1)
    if env.get("KLIQUE_SIM_MAX_ARRAY_SIZE"):
        found["max_array_size"] = env_int("KLIQUE_SIM_MAX_ARRAY_SIZE", 10000)
    return found


def default_config(flavor: str) -> dict:
    host = short_host()
    return {
        "gpus": 4,
        "cpus": 16,
        "mem_mb": 64 * 1024,
        "keep": 300.0,
        "kill_delay": 10.0,  # PBS kill_delay, LSF JOB_TERMINATE_INTERVAL
        "queues": [DEFAULT_QUEUES[flavor]],
        "lsf_minute": 60.0,
        "server": host,
        "host": host,
        "cluster": "klique_cluster",
        "nodes": 1,
        "pbs_version": PBS_VERSION,
        "max_array_size": 10000,  # PBS Professional server attribute (Reference Guide)
        **VENDOR_DEFAULTS[flavor],
    }


def _make_dir(path: str) -> None:
    try:
        os.makedirs(path, exist_ok=True)
        if os.stat(path).st_uid == os.getuid():
            os.chmod(path, 0o777)
    except PermissionError:
        pass


class Sim:
    """One simulated server: its folder, its lock and its job table."""

    def __init__(self, flavor: str) -> None:
        self.flavor = flavor
        root = os.environ.get("KLIQUE_SIM_DIR") or "/tmp/klique-sim"
        self.dir = os.path.join(root, flavor)
        self.jobs_dir = os.path.join(self.dir, "jobs")
        self.tmp_dir = os.path.join(self.dir, "tmp")
        self.state_path = os.path.join(self.dir, "state.json")
        for path in (root, self.dir, self.jobs_dir, self.tmp_dir):
            _make_dir(path)

    @contextlib.contextmanager
    def _flock(self, mode: int) -> Iterator[None]:
        fd = os.open(os.path.join(self.dir, "lock"), os.O_RDWR | os.O_CREAT, 0o666)
        try:
            with contextlib.suppress(PermissionError):
                if os.fstat(fd).st_uid == os.getuid():
                    os.fchmod(fd, 0o666)
            fcntl.flock(fd, mode)
            yield
        finally:
            os.close(fd)

    def _load(self) -> tuple[str, dict]:
        try:
            with open(self.state_path) as handle:
                raw = handle.read()
            data = json.loads(raw)
        except FileNotFoundError:
            raw = ""
            data = {"next_id": FIRST_ID[self.flavor], "config": {}, "jobs": {}}
        data["config"] = {**default_config(self.flavor), **data["config"], **_config_from_env()}
        return raw, data

    def _save(self, text: str) -> None:
        tmp = os.path.join(self.dir, f".state.{os.getpid()}.{time.monotonic_ns()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "w") as handle:
            os.fchmod(handle.fileno(), 0o666)
            handle.write(text)
        os.replace(tmp, self.state_path)

    @contextlib.contextmanager
    def writing(self) -> Iterator[dict]:
        """The state under LOCK_EX; written back on leaving only if it changed."""
        with self._flock(fcntl.LOCK_EX):
            raw, data = self._load()
            yield data
            purge(self, data, time.time())
            text = json.dumps(data, separators=_SEPARATORS)
            if text != raw:
                self._save(text)

    @contextlib.contextmanager
    def reading(self) -> Iterator[dict]:
        """A consistent snapshot under LOCK_SH; nothing is written back."""
        with self._flock(fcntl.LOCK_SH):
            _, data = self._load()
        now, keep = time.time(), data["config"]["keep"]
        data["jobs"] = {
            k: j
            for k, j in data["jobs"].items()
            if not (j["state"] == DONE and j["end_time"] + keep < now)
        }
        yield data

    def signature(self) -> tuple | None:
        try:
            st = os.stat(self.state_path)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def job_dir(self, seq: int) -> str:
        return os.path.join(self.jobs_dir, str(seq))


def allocate_id(data: dict) -> int:
    seq = data["next_id"]
    data["next_id"] = seq + 1
    return seq


def array_element(data: dict, job: dict, index: int) -> dict:
    """One element of an array job (PBS Professional `qsub -J`, LSF `bsub -J "name[list]"`):
    a copy of the array's `job` with {"id": the array's id, "index": its own} under "array",
    and an id of its own taken after the array's, which no command shows (the name of the
    element's folder under jobs/ and the supervisor's key). The supervisor runs each element
    as a job; the commands show it by `shown_id`."""
    return {
        **copy.deepcopy(job),
        "id": allocate_id(data),
        "array": {"id": job["id"], "index": index},
    }


def shown_id(job: dict) -> str:
    """The job's number as the commands show it: an array element's is its array's number
    and its index, "1000[3]"."""
    array = job.get("array")
    return f"{array['id']}[{array['index']}]" if array else str(job["id"])


def purge(sim: Sim, data: dict, now: float) -> None:
    """Finished jobs leave the history after the keep time (PBS job_history_duration,
    Torque keep_completed, LSF CLEAN_PERIOD)."""
    keep = data["config"]["keep"]
    for key in [
        k for k, j in data["jobs"].items() if j["state"] == DONE and j["end_time"] + keep < now
    ]:
        import shutil

        del data["jobs"][key]
        shutil.rmtree(sim.job_dir(int(key)), ignore_errors=True)


def _shortage(job: dict, free: dict, cfg: dict) -> list | None:
    for name, want, have, total in (
        ("ncpus", job["ncpus"], free["ncpus"], cfg["cpus"]),
        ("ngpus", job["ngpus"], len(free["gpus"]), cfg["gpus"]),
        ("mem", job["mem_mb"] or 0, free["mem_mb"], cfg["mem_mb"]),
    ):
        if want > have:
            return [name, want, have, total]
    return None


def schedule(data: dict, now: float) -> None:
    """First fit in submission order over one execution host's CPUs, GPUs and memory."""
    cfg = data["config"]
    running = [j for j in data["jobs"].values() if j["state"] == RUNNING]
    busy = {g for j in running for g in j["gpus"]}
    free = {
        "ncpus": cfg["cpus"] - sum(j["ncpus"] for j in running),
        "mem_mb": cfg["mem_mb"] - sum(j["mem_mb"] or 0 for j in running),
        "gpus": [g for g in range(cfg["gpus"]) if g not in busy],
    }
    for job in sorted(
        (j for j in data["jobs"].values() if j["state"] == QUEUED and not j.get("held")),
        key=lambda j: j["id"],
    ):
        lack = _shortage(job, free, cfg)
        if lack:
            job["pending"] = lack
            continue
        job.update(
            state=RUNNING,
            pending=None,
            start_time=now,
            gpus=free["gpus"][: job["ngpus"]],
            exec_host=cfg["host"],
            # OpenPBS req_runjob.c svr_strtjob2: the run count grows each time the job is sent
            # to run (a job requeued and run again shows 2).
            run_count=job.get("run_count", 0) + 1,
        )
        free["gpus"] = free["gpus"][job["ngpus"] :]
        free["ncpus"] -= job["ncpus"]
        free["mem_mb"] -= job["mem_mb"] or 0


def finish(job: dict, now: float, returncode: int | None) -> None:
    """Record the end of a job; returncode is Popen's (negative: killed by that signal)."""
    job.update(state=DONE, end_time=now)
    if returncode is None:
        job.update(exit_code=None, signal=None)
    elif returncode < 0:
        job.update(exit_code=None, signal=-returncode)
    else:
        job.update(exit_code=returncode, signal=None)


def requeue(job: dict, held: bool = False) -> None:
    """Back to the queue after its run was killed (qrerun, brequeue) or, for a finished job,
    at once (qrerun of an array job, brequeue -d/-e): it keeps its id, submission time and
    run count, and runs again from the start (PBS Professional Reference Guide, qrerun(1B);
    IBM Spectrum LSF 10.1 Command Reference, brequeue: PEND, or PSUSP with -H)."""
    job.update(
        state=QUEUED,
        held=held,
        requeued=job.get("requeued", 0) + 1,
        requeue=None,
        start_time=None,
        launch_time=None,
        end_time=None,
        exit_code=None,
        signal=None,
        pid=None,
        daemon_pid=None,
        gpus=[],
        exec_host=None,
        pending=None,
        kill=None,
        kill_steps=0,
        kill_next=None,
        lost=None,
    )


def ask_requeue(job: dict, now: float, held: bool = False) -> None:
    """Record a requeue request: a running job's supervisor kills it (the kill sequence of a
    cancel) and queues it again once it has ended; a job that has not run (or has ended) goes
    back to the queue at once."""
    if job["state"] == RUNNING:
        job["requeue"] = {"time": now, "by": os.getuid(), "held": held}
    else:
        requeue(job, held)


def host_names(cfg: dict) -> list[str]:
    """The execution hosts: the one host, or KLIQUE_SIM_NODES hosts <host>-1..<host>-N, all
    on this machine (a job on several of them runs one process per host it was given)."""
    count = cfg.get("nodes", 1)
    return [cfg["host"]] if count <= 1 else [f"{cfg['host']}-{i}" for i in range(1, count + 1)]


def job_hosts(job: dict, cfg: dict) -> list[str]:
    """The hosts a job was given: the first `hosts` (native) execution hosts, else the one."""
    return host_names(cfg)[: job["native"].get("hosts", 1)] or [cfg["host"]]


def beyond_host(job: dict, cfg: dict) -> list | None:
    """What the job asks beyond the whole host: [resource, wanted, 0, total] or None."""
    return _shortage(
        job, {"ncpus": cfg["cpus"], "mem_mb": cfg["mem_mb"], "gpus": list(range(cfg["gpus"]))}, cfg
    )


def new_job(flavor: str, seq: int, user: dict, **fields: object) -> dict:
    """The flavor-independent job record; submit commands fill in the rest."""
    job = {
        "id": seq,
        "flavor": flavor,
        "owner": user["name"],
        "uid": user["uid"],
        "gid": user["gid"],
        "group": user["group"],
        "home": user["home"],
        "shell": user["shell"],
        "submit_host": short_host(),
        "state": QUEUED,
        "submit_time": time.time(),
        "start_time": None,
        "launch_time": None,
        "end_time": None,
        "exit_code": None,
        "signal": None,
        "pid": None,
        "daemon_pid": None,
        "gpus": [],
        "exec_host": None,
        "pending": None,
        "kill": None,
        "kill_steps": 0,
        "kill_next": None,
        "cancel": None,
        "ncpus": 1,
        "ngpus": 0,
        "mem_mb": None,
        "walltime": None,
        "native": {},
    }
    job.update(fields)
    return job
