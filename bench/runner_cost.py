"""What the runner costs a job that runs `true`: the CPU time (user + system) of one runner
process, as the batch script starts it (`python3 -I -S klique-runner.pyz JOB_DIR`), with and
without HTTP reports, against the same run's floor, `python3 -c pass`, and reporting when started
without `-I -S` (as before 2026-12-03: with the node's site, its `.pth` files and the
account's). Reports go to a bare HTTP sink on loopback (it answers 200 and counts them); the
server's side of a report is api_create.py's.

Last line: the medians in ms, the ratios to the floor, and the reports a run sends.
"""

from __future__ import annotations

import json
import resource
import statistics
import subprocess
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from _common import last_line

from broker.agents.factory import build_runner

RUNS = 30
PYTHON = "/usr/bin/python3"  # as the jobs run it
FLAGS = ("-I", "-S")  # as partials/run.sh.j2 starts it


class Sink(BaseHTTPRequestHandler):
    posts = 0

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        Sink.posts += 1
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def cpu_ms(argv: list[str]) -> float:
    """The CPU time of one child process running `argv`, in ms."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    used = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return used * 1000


def main() -> None:
    sink = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{sink.server_address[1]}"
    with tempfile.TemporaryDirectory(prefix="klique-bench-runner-") as scratch:
        root = Path(scratch)
        runner = str(build_runner(root))

        def job(n: int, report: bool, tag: str = "") -> str:
            folder = root / f"job-{n}-{int(report)}{tag}"
            folder.mkdir()
            task = {"version": 1, "id": 7, "code": None, "command": ["true"]}
            task["cache_dir"] = str(root / "cache")
            if report:
                task["report"] = {"url": url, "token": "t"}
            (folder / "task.json").write_text(json.dumps(task))
            return str(folder)

        samples: dict[str, list[float]] = {
            "floor": [],
            "runner": [],
            "runner_reporting": [],
            "reporting_with_site": [],
        }
        for n in range(RUNS):  # interleaved, so that a change of load hits them all alike
            samples["floor"].append(cpu_ms([PYTHON, "-c", "pass"]))
            samples["runner"].append(cpu_ms([PYTHON, *FLAGS, runner, job(n, False)]))
            samples["runner_reporting"].append(cpu_ms([PYTHON, *FLAGS, runner, job(n, True)]))
            samples["reporting_with_site"].append(cpu_ms([PYTHON, runner, job(n, True, "s")]))
    sink.shutdown()
    medians = {name: round(statistics.median(values), 1) for name, values in samples.items()}
    for name, value in medians.items():
        print(f"{name:<18} {value:>7.1f} ms CPU (median of {RUNS})")
    print(f"reports per run: {Sink.posts / (2 * RUNS):g}")
    last_line(
        {
            **{f"{name}_ms": value for name, value in medians.items()},
            "runner_to_floor": round(medians["runner"] / medians["floor"], 2),
            "reporting_to_floor": round(medians["runner_reporting"] / medians["floor"], 2),
            "reports_per_run": Sink.posts / (2 * RUNS),
        }
    )


if __name__ == "__main__":
    main()
