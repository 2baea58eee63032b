"""`klique demo` as the console command runs it: the demo drives the CLI's commands (it
submits, follows the console with `klique logs -f`'s code, waits for the end)."""

import os
import re
import subprocess
import sys

from conftest import ROOT


def demo(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "broker", "demo", *args],
        env={**os.environ, **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_demo_follows_its_task_to_the_end_on_a_running_server(host_server):
    done = demo(env=host_server.env())
    said = done.stdout + done.stderr
    assert done.returncode == 0, said
    assert f"using the Klique server at {host_server.url}" in done.stdout, said
    assert "step 5/5: sum of squares so far" in done.stdout and "\ndone\n" in done.stdout, said
    assert re.search(r"^task \d+ completed on pool local \(exit code 0\)", done.stdout, re.M), said
    assert "next: `klique ls`, `klique show ID`, `klique demo --stop`" in done.stdout


def test_demo_stop_without_a_demo_server_says_so(tmp_path):
    done = demo("--stop", env={"KLIQUE_HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert done.stdout == "no demo server to stop\n"
