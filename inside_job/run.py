"""One run of a task: status, setup, the command, signals, and the exit file.

A task on several nodes has one runner per node (`--node`): each prepares its own node and
writes its own console and exit file; rank 0 alone reports the task's state. When all have
ended, the batch script's `--gather` step writes exit.json, the worst of the ranks' endings
(inside_job/gather.py)."""

from __future__ import annotations

import os
import signal
import sys
import time

from inside_job import jobfiles, oom, outcome, process, termination
from inside_job.errors import SetupFailed

TYPE_CHECKING = False
if TYPE_CHECKING:
    from inside_job.jobfiles import Console
    from inside_job.prepared import Prepared
    from inside_job.ranks import Place
    from inside_job.reporter import Reporter
    from inside_job.spec import TaskSpec


class Run:
    """The state of one run, shared with the signal handler."""

    def __init__(self, job_dir: str, place: Place | None = None) -> None:
        self.job_dir = job_dir
        self.place = place  # None: the task's only runner
        rank = place.rank if place is not None else 0
        self.exit_file = jobfiles.rank_exit_file(rank) if place is not None else jobfiles.EXIT_FILE
        self.console = jobfiles.Console(job_dir, jobfiles.rank_console_file(rank))
        self.reporter: Reporter | None = None
        self.started: float | None = None
        self.forwarder = process.SignalForwarder(on_stop=self._on_stop)
        self.run_limit: int | None = None  # the scheduler's run-limit warning, once known
        self.spec: TaskSpec | None = None

    def publish(self, state: str, pid: int | None = None) -> None:
        if self.place is not None and self.place.rank:
            return  # rank 0 speaks for the task
        status = jobfiles.status(state, pid)
        jobfiles.write_status(self.job_dir, status)
        if self.reporter is not None:
            self.reporter.state(status)

    def execute(self) -> dict:
        """Set up and run the task; returns the exit.json fields (without times)."""
        try:
            # on its path only: every job starts the runner
            from inside_job import spec as task_spec

            spec = task_spec.load(self.job_dir)
            self.spec = spec
            self._expect_run_limit(spec.scheduler)
            if self.place is not None or spec.nodes > 1:
                self._take_place(spec)
            if spec.report is not None and not (self.place and self.place.rank):
                # on its path only: every job starts the runner
                from inside_job.reporter import Reporter

                self.reporter = Reporter(spec.report.url, spec.report.token, spec.id, self.job_dir)
            self.publish("setting_up")
            # on its path only: every job starts the runner
            from inside_job.prepare import clean_up, prepare

            prepared = prepare(spec, self.console)
            try:
                return self._run_command(prepared)
            finally:
                clean_up(prepared)
        except SetupFailed as exc:
            self.console.say(f"setup failed: {exc.reason}")
            return outcome.result(exc.exit_code, "setup_failed", exc.reason)
        except process.Terminated as exc:
            return outcome.stopped(exc.signum, 128 + exc.signum, self.job_dir, self.run_limit)

    def _take_place(self, spec: TaskSpec) -> None:
        if self.place is None:
            raise SetupFailed(
                f"the task asks for {spec.nodes} nodes, but its runner was started alone: the "
                "batch template must start one runner per node with `node_launch` (see "
                "templates/README.md)"
            )
        if self.place.world != spec.nodes:
            raise SetupFailed(
                f"the task asks for {spec.nodes} nodes, but {self.place.world} runners were "
                "started: the batch template must start one runner per node"
            )
        spec.place = self.place
        self.console.say(
            f"rank {self.place.rank} of {self.place.world} on {os.uname().nodename} "
            f"(MASTER_ADDR {self.place.master})"
        )

    def _expect_run_limit(self, scheduler: str) -> None:
        """Where the scheduler warns at the run limit, that signal ends the run as timed out."""
        self.run_limit = outcome.RUN_LIMIT_WARNING.get(scheduler)
        if self.run_limit is not None:
            self.forwarder.stops += (self.run_limit,)

    def _run_command(self, prepared: Prepared) -> dict:
        fd = self.console.fd
        oom_before = oom.kills()  # the cgroup's OOM kills before the task: a SIGKILL's cause
        pid = process.spawn(self.forwarder, prepared.argv, prepared.env, prepared.cwd, fd)
        self.started = time.time()
        self.publish("running", pid)
        app = self._start_app(prepared, pid)
        try:
            wait_status = process.wait(pid)
        finally:
            if app is not None:
                app.stop()
        stop = self.forwarder.stop_signal()
        res = outcome.classify(wait_status, stop, self.job_dir, self.run_limit)
        if res["signal"] == signal.SIGKILL and stop is None and oom.killed_since(oom_before):
            res = outcome.result(res["exit_code"], "signalled", oom.OOM_REASON, signal.SIGKILL)
        if app is not None and app.walltime_hit and stop is None:
            res = outcome.result(res["exit_code"], "timeout", app.walltime_reason(), res["signal"])
        if prepared.env_info is not None:
            res["environment"] = prepared.env_info
        return res

    def _start_app(self, prepared: Prepared, pid: int) -> AppRunning | None:
        if prepared.app is None or self.spec is None:
            return None
        return AppRunning(self.spec, prepared, pid, self.console)

    def _on_stop(self, signum: int) -> None:
        # Written now in case the scheduler kills the runner before the task has ended; the
        # first stop decides (a run-limit warning, then the kill after its grace).
        first = self.forwarder.stop_signal() or signum
        res = outcome.stopped(first, 128 + first, self.job_dir, self.run_limit)
        self._write_exit(outcome.stamp(res, self.started))

    def _write_exit(self, result: dict) -> None:
        """exit.json, and the pod's termination message where there is one (the task's only
        runner: the ranks of a task on several nodes have no pod)."""
        jobfiles.write_exit(self.job_dir, result, self.exit_file)
        if self.place is None:
            try:
                termination.write(result)
            except OSError as exc:  # exit.json holds the record still
                self.console.say(f"could not write the termination message: {exc.strerror}")

    def finish(self, res: dict) -> int:
        final = outcome.stamp(res, self.started)
        self._write_exit(final)
        if self.place is None:
            self.publish("done")
        if self.reporter is not None:  # on several nodes, the gather step reports the end
            self.reporter.close(final if self.place is None else None)
        self.console.close()
        return int(final["exit_code"])


class AppRunning:
    """An app's route tunnel, and its walltime: the run ends at walltime_s, as a timeout."""

    KILL_GRACE_S = 10.0

    def __init__(self, spec: TaskSpec, prepared: Prepared, pid: int, console: Console) -> None:
        import threading

        assert spec.app is not None and prepared.app is not None
        self.walltime_s = spec.app.walltime_s
        self.walltime_hit = False
        self.pid = pid
        self.tunnel = None
        if spec.report is None:
            console.say("route: the server is not reachable from this job, so its route is closed")
        else:
            # on its path only: every job starts the runner
            from inside_job.tunnel import Tunnel, tunnel_url

            app = prepared.app
            url = tunnel_url(spec.report.url, spec.id)
            self.tunnel = Tunnel(
                url, spec.report.token, app.port, app.upstream_headers, app.ready_path, console
            )
            self.tunnel.start()
        self.timer = None
        if self.walltime_s:
            self.timer = threading.Timer(self.walltime_s, self._out_of_time)
            self.timer.daemon = True
            self.timer.start()

    def _out_of_time(self) -> None:
        self.walltime_hit = True
        for signum, delay in ((signal.SIGTERM, self.KILL_GRACE_S), (signal.SIGKILL, 0.0)):
            try:
                os.killpg(self.pid, signum)
            except ProcessLookupError:
                return
            time.sleep(delay)

    def walltime_reason(self) -> str:
        return f"ran past its walltime ({self.walltime_s} s); the app was stopped"

    def stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if self.tunnel is not None:
            self.tunnel.stop()


def run(job_dir: str, node: bool = False) -> int:
    """Run the task of job_dir (node: as one of the runners of a task on several nodes); the
    return value is the task's exit code (setup failure: 125)."""
    job_dir = os.path.abspath(job_dir)
    try:
        place = _place() if node else None
        jobfiles.forget_outcome(job_dir, place.rank if place is not None else None)
        current = Run(job_dir, place)
    except SetupFailed as exc:
        sys.stderr.write(f"klique-runner: {exc.reason}\n")
        return exc.exit_code
    except OSError as exc:
        sys.stderr.write(f"klique-runner: cannot use job directory {job_dir}: {exc.strerror}\n")
        return 125
    try:
        res = current.execute()
    except process.Terminated as exc:
        res = outcome.stopped(exc.signum, 128 + exc.signum, job_dir, current.run_limit)
    for signum in process.FORWARDED:  # the task is over: nothing may cut the exit file short
        signal.signal(signum, signal.SIG_IGN)
    return current.finish(res)


def _place() -> Place:
    from inside_job.ranks import find  # on its path only: every job starts the runner

    return find(dict(os.environ))
