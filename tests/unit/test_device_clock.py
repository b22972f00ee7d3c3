"""DeviceClock's bucket estimates, which the batcher compares to size a busy device's batch."""

from __future__ import annotations

import pytest

from app.batching.device_clock import DeviceClock


def test_a_bucket_not_yet_measured_is_guessed_hopefully_from_the_nearest_measured_one() -> None:
    clock = DeviceClock(devices=1)
    assert clock.estimate_s(8) == 0.0  # nothing measured: no estimate, the batcher takes everything
    clock.finished(0, 64, 0.0032, now=0.0, still_there=[])
    clock.finished(0, 8, 0.0009, now=0.0, still_there=[])
    assert clock.estimate_s(64) == pytest.approx(0.0032)  # measured
    assert clock.estimate_s(128) == pytest.approx(0.0032)  # larger than 64: no slower, until tried
    assert clock.estimate_s(48) == pytest.approx(0.0024)  # smaller than 64, the nearer: by its rows
    assert clock.estimate_s(16) == pytest.approx(0.0009)  # larger than 8, the nearer
    assert clock.expected_s(128) == 0.0  # the launch clock counts only what was measured
