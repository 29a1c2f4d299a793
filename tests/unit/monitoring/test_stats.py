"""Statistics (``monitoring/stats.py``): arguments refused before any query. The numbers,
on seeded data, are tested in ``tests/integration/test_stats.py``."""

from __future__ import annotations

from typing import Any

import pytest

from django_pgtasks.monitoring import stats


@pytest.mark.parametrize("hours", [0, -1, 1.5, True, "24", None])
def test_throughput_refuses_bad_windows(hours: Any) -> None:
    with pytest.raises(ValueError, match="hours must be a positive integer"):
        stats.throughput(hours=hours)
