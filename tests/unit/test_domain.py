import pytest

from broker.domain import FINAL_STATES, TRANSITIONS, TaskState, transition
from broker.errors import IllegalTransition

S = TaskState


def test_every_state_has_a_row_and_final_states_lead_nowhere():
    assert set(TRANSITIONS) == set(TaskState)
    for state in FINAL_STATES:
        assert TRANSITIONS[state] == frozenset()
        assert state.final


@pytest.mark.parametrize(
    "path",
    [
        [S.CREATED, S.QUEUED, S.PLACED, S.SUBMITTED, S.PENDING, S.RUNNING, S.COMPLETED],
        [S.QUEUED, S.PLACED, S.SUBMITTED, S.RUNNING, S.TIMEOUT],
        [S.QUEUED, S.PLACED, S.SUBMITTED, S.PENDING, S.QUEUED],  # spill-over
        [S.QUEUED, S.PLACED, S.SUBMITTED, S.RUNNING, S.QUEUED],  # preempted and requeued
        [S.QUEUED, S.HELD, S.QUEUED, S.CANCELLED],
        [S.QUEUED, S.PLACED, S.SUBMITTED, S.LOST],
    ],
)
def test_lifecycles_are_allowed(path):
    for old, new in zip(path, path[1:], strict=False):
        assert transition(old, new) is new


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (S.COMPLETED, S.RUNNING),
        (S.QUEUED, S.RUNNING),
        (S.PLACED, S.COMPLETED),
        (S.CANCELLED, S.QUEUED),
        (S.LOST, S.COMPLETED),
        (S.HELD, S.RUNNING),
    ],
)
def test_illegal_transitions_raise_with_the_allowed_ones(old, new):
    with pytest.raises(IllegalTransition) as err:
        transition(old, new)
    assert old.value in str(err.value) and new.value in str(err.value)
    assert "allowed" in str(err.value)


def test_repeating_a_state_is_not_an_error():
    assert transition(S.RUNNING, S.RUNNING) is S.RUNNING


def test_a_reason_belongs_to_the_state_it_explained(tmp_path):
    """A task shown running never carries the reason it was pending for."""
    from broker.domain import TaskSpec, TaskState
    from broker.store.repository import Store

    store = Store.open(f"sqlite:///{tmp_path / 'k.db'}")
    try:
        task = store.create_task(TaskSpec(("true",), "cpu"), "alice", None)
        for state in (TaskState.PLACED, TaskState.SUBMITTED):
            store.change_state(task.id, state)
        store.change_state(task.id, TaskState.PENDING, "pending in Slurm's queue; Priority")
        assert store.get(task.id).reason == "pending in Slurm's queue; Priority"
        running = store.change_state(task.id, TaskState.RUNNING)  # a report with no reason
        assert running is not None and running.reason == ""
        store.change_state(task.id, TaskState.RUNNING, "the report is ignored")  # same state
        assert store.get(task.id).reason == "the report is ignored"
    finally:
        store.close()
