"""Klique's errors, drawn once:

    KliqueError                  every error Klique raises on purpose; its message is for a user
    ├── EstateError              the estate file is invalid (carries every problem found)
    ├── IllegalTransition        a task state change the state machine forbids
    ├── NotFound                 no such task, compute resource or pool
    ├── NotPermitted             the user may not do this (policy, ownership, unmapped account)
    ├── Conflict                 not now: the task's state does not allow it (an ended attempt)
    │   └── Fenced               a replica whose lease's term moved on wrote as the leader
    ├── TooLarge                 over one of the server's size limits (limits: in the estate)
    ├── SubmitError              a pool refused or failed a submission (with the pool's words)
    │   └── SubmitUnknown        the outcome of a submission is unknown (look the tag up first)
    ├── TransportError           a command could not be run (local or over SSH)
    ├── CommandFailed            a command ran and failed (a job folder that cannot be made)
    └── TemplateError            a batch template failed to render (file and line)

Lower-layer errors (OSError, asyncssh, Jinja2, SQLAlchemy) are translated at the boundary
with `raise ... from exc`. The HTTP status of each kind is the adapters' to decide
(broker/http/errors.py holds the one table).
"""

from __future__ import annotations


class KliqueError(Exception):
    """An error whose message a user can act on."""


class EstateError(KliqueError):
    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


class IllegalTransition(KliqueError):
    pass


class NotFound(KliqueError):
    pass


class NotPermitted(KliqueError):
    pass


class Conflict(KliqueError):
    pass


class Fenced(Conflict):
    """A write that acts on the estate carried a term that is no longer the lease's: another
    replica leads now (broker/control/lease.py); nothing of it was written."""


class TooLarge(KliqueError):
    pass


class SubmitError(KliqueError):
    pass


class SubmitUnknown(SubmitError):
    pass


class TransportError(KliqueError):
    pass


class CommandFailed(KliqueError):
    pass


class TemplateError(KliqueError):
    pass
