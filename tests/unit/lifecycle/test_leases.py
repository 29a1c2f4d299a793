"""Leases and liveness (``lifecycle/leases.py``): the advisory-lock key of a worker, and the
settings the lost-worker conditions take. The conditions themselves run on PostgreSQL
(``tests/integration/test_rescue.py``)."""

from __future__ import annotations

import pytest

from django_pgtasks.lifecycle.leases import (
    MAX_INT4,
    abandoned_params,
    lock_key,
    lost_worker_params,
)


@pytest.mark.parametrize(("worker_pk", "key"), [
    (1, 1),
    (2, 2),
    (MAX_INT4 - 1, MAX_INT4 - 1),
    (MAX_INT4, 1),  # wraps round, never 0 and never past an int4
    (MAX_INT4 + 1, 2),
    (2**62, (2**62 - 1) % (MAX_INT4 - 1) + 1),
])
def test_a_workers_lock_key_is_a_positive_int4_from_its_row_id(worker_pk: int, key: int) -> None:
    assert lock_key(worker_pk) == key
    assert 1 <= lock_key(worker_pk) <= MAX_INT4 - 1


def test_consecutive_workers_get_distinct_keys() -> None:
    keys = [lock_key(pk) for pk in range(1, 10_001)]
    assert len(set(keys)) == len(keys)


def test_the_lost_worker_conditions_take_the_grace_and_the_timeout(pgtasks) -> None:
    pgtasks(RESCUE_GRACE=5, WORKER_TIMEOUT=60)
    assert lost_worker_params() == [5.0, 60.0]
    assert abandoned_params() == [5.0, 60.0, 60.0]
    assert all(isinstance(p, float) for p in abandoned_params())
