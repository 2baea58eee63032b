"""Entry point: `python3 klique-runner.pyz JOB_DIR` or `python3 -m inside_job JOB_DIR`."""

from __future__ import annotations

import sys

USAGE = "usage: klique-runner JOB_DIR\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        sys.stderr.write(USAGE)
        return 2
    from inside_job.run import run

    return run(args[0])


if __name__ == "__main__":
    sys.exit(main())
