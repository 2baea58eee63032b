"""Entry point: `python3 klique-runner.pyz [--node | --gather] JOB_DIR` or `python3 -m inside_job
...`. `--node`: one of the runners of a task on several nodes (one per node, started by srun,
pbsdsh or blaunch); `--gather`: the batch script's last step for such a task, which writes its
exit.json from the ranks' endings."""

from __future__ import annotations

import sys

USAGE = "usage: klique-runner [--node | --gather] JOB_DIR\n"
MODES = ("--node", "--gather")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    mode = args[0] if len(args) == 2 and args[0] in MODES else ""
    if mode:
        args = args[1:]
    if len(args) != 1 or args[0].startswith("-"):
        sys.stderr.write(USAGE)
        return 2
    if mode == "--gather":
        from inside_job.gather import gather  # on its path only: every job starts the runner

        return gather(args[0])
    from inside_job.run import run  # on its path only: every job starts the runner

    return run(args[0], node=mode == "--node")


if __name__ == "__main__":
    sys.exit(main())
