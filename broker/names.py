"""What a name-like value may look like: one place for the API, the estate and the templates.

Free text (a task's name, its arguments and environment values) never enters a script or a
path; names that do (users, teams, compute resources, pools, projects) match these patterns.
"""

from __future__ import annotations

import re

# Users, teams, compute resources, pools: a letter or digit, then letters, digits, . _ -
NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
# Projects read like words ("AI Engineering"): letters, digits, space and . _ - : @ + /
PROJECT = r"^[\w][\w .:@+/-]{0,199}$"
# Any printable text on one line: no control characters (newlines, escapes, NUL).
LINE = r"^[^\x00-\x1f\x7f]*$"
# Environment variable names, as POSIX shells accept them.
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
# Values that cannot hold NUL (argv, environment): anything else is the task's own business.
NO_NUL = r"^[^\x00]*$"
# Container images: a registry reference or a path on the nodes.
IMAGE = r"^[A-Za-z0-9/][A-Za-z0-9._/:@+#-]{0,511}$"
# A repository: a URL or a path; never something git would read as an option.
REPO = r"^[^-\x00-\x1f\x7f][^\x00-\x1f\x7f]{0,2047}$"
# An agent token's id (`klique token ls`): a prefix that tells it from a user's token's id, and
# the start of its digest.
AGENT_ID_PREFIX = "agent-"
AGENT_ID = r"^agent-[0-9a-f]{16}$"

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def has_control(text: str) -> bool:
    return _CONTROL.search(text) is not None


# Artifacts: a name like an identifier (never a path), and a file's own name (no folder, no
# leading dot: "." and ".." cannot be written).
ARTIFACT = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
FILENAME = r"^[A-Za-z0-9_][A-Za-z0-9._ +-]{0,254}$"
