"""`python3 -m klique step`: run a pipeline step inside its job."""

from __future__ import annotations

import sys


def main(argv: list) -> int:
    if argv[1:2] == ["step"]:
        from klique._step import main as step  # on its path only: every task imports klique

        return step()
    sys.stderr.write("usage: python3 -m klique step  (inside a pipeline step's job)\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
