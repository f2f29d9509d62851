"""The test harness's own checks: what ``no_tasks_submitted`` counts and what it leaves out."""

from __future__ import annotations

import operator

import pytest
from conftest import no_tasks_submitted, scheduler_watch


def test_a_submitted_task_is_seen(client2):
    with pytest.raises(AssertionError, match="1 keys reached the scheduler"), no_tasks_submitted(client2):
        assert client2.submit(operator.add, 1, 2, pure=False).result() == 3


def test_scattered_data_is_seen(client2):
    with pytest.raises(AssertionError, match="keys reached the scheduler"), no_tasks_submitted(client2):
        client2.scatter([1, 2, 3])


def test_releases_of_earlier_futures_are_not_counted(client2):
    """A previous test's futures may be released while the next one runs: that is not a submission."""
    futures = client2.map(operator.add, range(20), range(20), pure=False)
    client2.gather(futures)
    with no_tasks_submitted(client2):
        del futures
        client2.run_on_scheduler(lambda: None)  # the releases reach the scheduler inside the block


def test_a_watch_counts_only_its_own_transitions(client2):
    earlier = client2.submit(operator.add, 1, 1, pure=False)
    earlier.result()
    with scheduler_watch(client2) as watch:
        del earlier
        client2.submit(operator.mul, 3, 4, key="harness-own-key").result()
    assert watch.keys == ["harness-own-key"]
    assert set(watch.events) == {"harness-own-key"} and len(watch.events) >= 3  # released, waiting, ..., memory
