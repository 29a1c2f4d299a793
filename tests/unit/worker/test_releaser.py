"""The releaser's batch size follows what the server can do in one statement."""

from django_pgtasks.lifecycle.release import BATCH, MIN_BATCH, Turn
from django_pgtasks.worker.releaser import Releaser


def test_a_batch_that_ran_out_of_time_halves_the_next_ones_which_then_grow_back() -> None:
    releaser = Releaser("default")
    assert releaser.batch == BATCH
    releaser._adapt(Turn(timed_out=True, more=True))
    assert releaser.batch == BATCH // 2
    for _ in range(20):
        releaser._adapt(Turn(timed_out=True, more=True))
    assert releaser.batch == MIN_BATCH
    sizes = []
    while releaser.batch < BATCH:
        releaser._adapt(Turn(edges=releaser.batch, more=True))
        sizes.append(releaser.batch)
    assert sizes == sorted(sizes)
    assert releaser.batch == BATCH  # never beyond the full size
    releaser._adapt(Turn(edges=3))  # a partial batch leaves the size as it is
    assert releaser.batch == BATCH
