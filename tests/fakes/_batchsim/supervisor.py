"""The execution side of the simulated server: one detached supervisor per user.

qsub/bsub start it (double fork, setsid) when that user has none, so it runs with the
submitter's uid and gid, as a MoM/sbatchd starts jobs as their owner. It assigns
resources (for everyone's queued jobs), starts its user's jobs in their own session,
enforces walltime, carries out cancellations recorded by qdel/bkill and requeues recorded by
qrerun/brequeue, records exit statuses, and leaves once its user has nothing queued or running.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import sys
import time

from . import flavors
from .state import DONE, QUEUED, RUNNING, Sim, finish, requeue, schedule

POLL_SECONDS = 0.05
SAFETY_PASS_SECONDS = 1.0


def _lock_path(sim: Sim) -> str:
    return os.path.join(sim.dir, f"supervisor-{os.getuid()}.lock")


def ensure_supervisor(sim: Sim) -> None:
    """Start this user's supervisor unless one holds its lock already."""
    fd = os.open(_lock_path(sim), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
    sys.stdout.flush()
    sys.stderr.flush()
    child = os.fork()
    if child:
        os.waitpid(child, 0)
        return
    try:
        os.setsid()
        if os.fork():
            os._exit(0)
        _detach(sim)
        Supervisor(sim).run()
    finally:
        os._exit(0)


def _detach(sim: Sim) -> None:
    # No SIG_IGN here: ignored signals survive exec and jobs must feel SIGINT (bkill). A command
    # started in the background of a shell script inherits SIGINT and SIGQUIT ignored; an
    # execution host starts jobs with the default actions (OpenPBS mom_start.c, LSF res), so
    # they are set back here, in the session the jobs inherit them from.
    for signum in (signal.SIGINT, signal.SIGQUIT):
        signal.signal(signum, signal.SIG_DFL)
    # Server settings come from the state file from now on, not from the submitter's
    # environment, so a later command's KLIQUE_SIM_* values are not overridden.
    for name in [n for n in os.environ if n.startswith("KLIQUE_SIM_") and n != "KLIQUE_SIM_DIR"]:
        del os.environ[name]
    os.chdir("/")
    null = os.open(os.devnull, os.O_RDONLY)
    log = os.open(
        os.path.join(sim.dir, f"supervisor-{os.getuid()}.log"),
        os.O_WRONLY | os.O_CREAT | os.O_APPEND,
        0o644,
    )
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.closerange(3, 4096)


class Supervisor:
    def __init__(self, sim: Sim) -> None:
        self.sim = sim
        self.uid = os.getuid()
        self.children: dict = {}
        self.lock_fd: int | None = None
        self.last_signature: tuple | None = None
        self.last_pass = 0.0
        self.next_due: float | None = None

    def run(self) -> None:
        self.lock_fd = os.open(_lock_path(self.sim), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return
        while True:
            if not os.path.isdir(self.sim.dir):  # a test removed the server's folder
                for proc in self.children.values():
                    signal_job(proc.pid, signal.SIGKILL)  # the jobs go with the server
                return
            now = time.time()
            reaped = {seq: p.returncode for seq, p in self.children.items() if p.poll() is not None}
            due = self.next_due is not None and now >= self.next_due
            if (
                reaped
                or due
                or self.sim.signature() != self.last_signature
                or now - self.last_pass >= SAFETY_PASS_SECONDS
            ):
                try:
                    if not self._pass(reaped, now):
                        return
                except Exception:  # noqa: BLE001 - a supervisor must outlive one bad pass
                    import traceback

                    traceback.print_exc()
                    sys.stderr.flush()
                self.last_signature = self.sim.signature()
                self.last_pass = now
            time.sleep(POLL_SECONDS)

    def _pass(self, reaped: dict, now: float) -> bool:
        with self.sim.writing() as data:
            cfg = data["config"]
            for seq, code in reaped.items():
                self.children.pop(seq)
                job = data["jobs"].get(str(seq))
                if job and job["state"] != DONE and _requeued(job):
                    self._clean(job, cfg)
                    requeue(job, job["requeue"]["held"])
                elif job and job["state"] != DONE:
                    finish(job, now, code)
                    self._after(job, cfg)
            schedule(data, now)
            self.next_due = None
            for job in sorted(data["jobs"].values(), key=lambda j: j["id"]):
                if job["uid"] == self.uid and job["state"] == RUNNING:
                    self._tend(job, cfg, now)
            active = any(
                j["uid"] == self.uid and j["state"] in (QUEUED, RUNNING)
                for j in data["jobs"].values()
            )
            if not active and not self.children:
                os.close(self.lock_fd)
                return False
        return True

    def _tend(self, job: dict, cfg: dict, now: float) -> None:
        if job["pid"] is None:
            if job["cancel"]:
                finish(job, now, None)
            elif job.get("requeue"):
                requeue(job, job["requeue"]["held"])
            else:
                self._launch(job, cfg, now)
            return
        if job["id"] not in self.children:
            if not _alive(job["daemon_pid"]):
                job["lost"] = True
                finish(job, now, None)
            return
        if job["cancel"] and job["kill"] in (None, "requeue"):
            job.update(kill="cancel", kill_next=now, kill_steps=0)  # a cancel wins
        elif job.get("requeue") and not job["kill"]:
            job.update(kill="requeue", kill_next=now, kill_steps=0)
        deadline = None if job["walltime"] is None else flavors.walltime_deadline(job)
        if deadline is not None and not job["kill"]:
            if now >= deadline:
                job.update(kill="walltime", kill_next=now, kill_steps=0)
                if flavors.kills_walltime_with_a_code(cfg):
                    job["limit_code"] = -29  # JOB_EXEC_KILL_WALLTIME (PBS Professional)
                _append(_stderr_path(job), flavors.walltime_note(job, now))
            else:
                self._due(deadline)
        preempt_at = flavors.preemption_due(job, cfg)
        if preempt_at is not None and not job["kill"]:
            if now >= preempt_at:  # a job of a higher-priority queue takes its slots
                job.update(kill="preempt", kill_next=now, kill_steps=0)
            else:
                self._due(preempt_at)
        if job["kill"] and job["kill_next"] is not None:
            if now >= job["kill_next"]:
                steps = flavors.KILL_SEQUENCE[(job["flavor"], job["kill"])]
                signal_job(job["pid"], steps[job["kill_steps"]])
                job["kill_steps"] += 1
                more = job["kill_steps"] < len(steps)
                job["kill_next"] = now + flavors.next_delay(job, cfg) if more else None
            if job["kill_next"] is not None:
                self._due(job["kill_next"])

    def _due(self, when: float) -> None:
        self.next_due = when if self.next_due is None else min(self.next_due, when)

    def _launch(self, job: dict, cfg: dict, now: float) -> None:
        import subprocess

        job_dir = self.sim.job_dir(job["id"])
        files = flavors.owned_files(job, self.sim.tmp_dir, cfg, job_dir)
        _write(files["nodefile"], "".join(f"{h}\n" for h in flavors.node_lines(job, cfg)))
        _write(files["gpufile"], "".join(f"{cfg['host']}-gpu{g}\n" for g in job["gpus"]))
        with contextlib.suppress(OSError):
            os.makedirs(files["tmpdir"], mode=0o700, exist_ok=True)
        with open(os.path.join(job_dir, "env.json")) as handle:
            env = json.load(handle)
        env.update(flavors.runtime_env(job, cfg, files))
        env["PATH"] = flavors.with_commands(env.get("PATH"), job)
        out, err = _open_outputs(job)
        job.update(launch_time=now, daemon_pid=os.getpid())
        try:
            proc = subprocess.Popen(
                job["argv"],
                cwd=job["workdir"],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
        except OSError as exc:
            os.write(err, f"{job['argv'][0]}: {exc.strerror}\n".encode())
            finish(job, now, 127 if isinstance(exc, FileNotFoundError) else 126)
            self._after(job, cfg)
            return
        finally:
            for fd in {out, err}:
                os.close(fd)
        job["pid"] = proc.pid
        self.children[job["id"]] = proc

    def _clean(self, job: dict, cfg: dict) -> dict:
        """What is left of a run the execution host ends: its processes and its TMPDIR."""
        if job["pid"]:
            signal_job(job["pid"], signal.SIGKILL)
        job_dir = self.sim.job_dir(job["id"])
        files = flavors.owned_files(job, self.sim.tmp_dir, cfg, job_dir)
        import shutil

        shutil.rmtree(files["tmpdir"], ignore_errors=True)
        return files

    def _after(self, job: dict, cfg: dict) -> None:
        """Clean up after a job the way the execution host does once it has exited."""
        files = self._clean(job, cfg)
        if job["flavor"] == "lsf" and job["stdout"]:
            script = job["native"].get("command") or _read(files["script"])
            _append(job["stdout"], flavors.lsf_report(job, cfg, script))


def _requeued(job: dict) -> bool:
    """The run ended under a requeue request and no cancel: the job goes back to the queue."""
    return bool(job.get("requeue")) and not job["cancel"]


def signal_job(session: int, signum: int) -> None:
    """The signal to every process of the job: its session, which the job started (the
    runner puts its task in a group of its own, in the same session), as a MoM signals the
    job's session and LSF every process it tracks for the job."""
    targets = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _session_of(entry) == session:
            targets.add(int(entry))
    for pid in sorted(targets):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def _session_of(pid: str) -> int | None:
    """The session id in /proc/<pid>/stat (the sixth field; the name before it may hold
    spaces and parentheses)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            stat = handle.read()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    return int(fields[3]) if len(fields) > 3 and fields[3].isdigit() else None


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stderr_path(job: dict) -> str | None:
    return job["stdout"] if job["join"] == "oe" else job["stderr"]


def _open_outputs(job: dict) -> tuple[int, int]:
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if job["append"] else os.O_TRUNC)

    def opened(path: str | None) -> int:
        try:
            return os.open(path or os.devnull, flags, 0o644)
        except OSError:
            return os.open(os.devnull, os.O_WRONLY)

    if job["join"] == "oe" or (job["stderr"] in (None, job["stdout"]) and job["stdout"]):
        out = opened(job["stdout"])
        return out, out
    if job["join"] == "eo":
        err = opened(job["stderr"])
        return err, err
    return opened(job["stdout"]), opened(job["stderr"])


def _write(path: str, text: str) -> None:
    with contextlib.suppress(OSError), open(path, "w") as handle:
        handle.write(text)


def _append(path: str | None, text: str | None) -> None:
    if path and text:
        with contextlib.suppress(OSError), open(path, "a") as handle:
            handle.write(text)


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as handle:
            return handle.read()
    except OSError:
        return ""
