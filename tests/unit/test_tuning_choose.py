"""The tuner's choice on synthetic replay tables: no engine, no server (app/tuning/choose.py)."""

from __future__ import annotations

import itertools

import pytest

from app.tuning.choose import RHO_MAX, InfeasibleSloError, Timing, capacity, choose, kept_buckets

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
OVERHEAD = Timing(0.5e-3, 1.5e-3)
SLOS_MS = (4.0, 5.0, 6.0, 8.0, 10.0, 15.0, 20.0, 30.0, 50.0, 100.0)


def linear_table(launch_ms: float, per_row_ms: float, spread: float = 1.25) -> dict[int, Timing]:
    """bucket → Timing of a device whose batch costs launch + per_row × bucket (p99 `spread`× the median)."""
    return {b: Timing((launch_ms + per_row_ms * b) / 1e3, spread * (launch_ms + per_row_ms * b) / 1e3) for b in BUCKETS}


TABLES = {
    "launch-bound GPU": linear_table(0.8, 0.04),
    "compute-bound GPU": linear_table(0.2, 0.2),
    "CPU": linear_table(0.1, 1.0),
}


@pytest.mark.parametrize("table", TABLES.values(), ids=TABLES.keys())
def test_a_tighter_slo_never_picks_a_larger_max_delay_nor_gets_more_throughput(table: dict[int, Timing]) -> None:
    choices = []
    for slo in sorted(SLOS_MS, reverse=True):
        try:
            choices.append(choose(table, OVERHEAD, slo))
        except InfeasibleSloError:
            break
    assert len(choices) >= 3  # the sweep reached tight SLOs, where the property bites
    for looser, tighter in itertools.pairwise(choices):
        assert tighter.max_delay_ms <= looser.max_delay_ms
        assert tighter.capacity_rps <= looser.capacity_rps
        assert tighter.buckets[-1] <= looser.buckets[-1]


@pytest.mark.parametrize("table", TABLES.values(), ids=TABLES.keys())
@pytest.mark.parametrize("slo_ms", SLOS_MS)
def test_the_predicted_p99_stays_within_the_slo(table: dict[int, Timing], slo_ms: float) -> None:
    try:
        choice = choose(table, OVERHEAD, slo_ms)
    except InfeasibleSloError:
        return
    assert choice.worst_p99_ms <= slo_ms
    assert choice.p99_at_capacity_ms <= choice.worst_p99_ms
    assert choice.max_delay_ms < slo_ms


def test_a_looser_slo_buys_throughput_with_larger_batches_and_a_longer_delay() -> None:
    table = TABLES["launch-bound GPU"]
    tight, loose = choose(table, OVERHEAD, 5.0), choose(table, OVERHEAD, 50.0)
    assert loose.capacity_rps > 2 * tight.capacity_rps
    assert loose.buckets[-1] > tight.buckets[-1]
    assert loose.max_delay_ms > tight.max_delay_ms > 0


def test_an_infeasible_slo_names_the_fastest_achievable_p99() -> None:
    table = TABLES["launch-bound GPU"]  # bucket 1: p99 1.05 ms; overhead p99 1.5 ms
    with pytest.raises(InfeasibleSloError, match=r"fastest achievable p99 is 3\.60 ms") as caught:
        choose(table, OVERHEAD, 3.0)
    assert caught.value.fastest_ms == pytest.approx(2 * 1.05 + 1.5)
    choose(table, OVERHEAD, 3.7)  # just above it, a choice exists


def test_the_fastest_p99_comes_from_the_fastest_bucket_a_lone_request_can_use() -> None:
    noisy = {1: Timing(2e-3, 5e-3), 2: Timing(1.5e-3, 2e-3)}  # bucket 1 slower than 2: left out beside it
    with pytest.raises(InfeasibleSloError) as caught:
        choose(noisy, OVERHEAD, 5.0)
    assert caught.value.fastest_ms == pytest.approx(2 * 2.0 + 1.5)
    assert choose(noisy, OVERHEAD, 6.0).buckets == (2,)


def test_one_bucket_without_delay_is_limited_by_its_own_replay() -> None:
    table = {1: Timing(1e-3, 1e-3)}
    found = capacity(table, (1,), 0.0, Timing(0.0, 0.0), slo_s=1.0)
    assert found is not None
    assert found.capacity_rps == pytest.approx(RHO_MAX / 1e-3)
    assert found.worst_p99_ms == pytest.approx(2.0)


def test_a_bucket_no_faster_than_a_larger_one_is_left_out() -> None:
    noisy = {1: Timing(1e-3, 2e-3), 2: Timing(3e-3, 4e-3), 4: Timing(2e-3, 3e-3), 8: Timing(5e-3, 6e-3)}
    assert kept_buckets(noisy, 8) == (1, 4, 8)
    assert kept_buckets(noisy, 2) == (1, 2)


def test_bad_inputs_are_refused_with_a_reason() -> None:
    with pytest.raises(ValueError, match="no measured buckets"):
        choose({}, OVERHEAD, 10.0)
    with pytest.raises(ValueError, match="positive"):
        choose(TABLES["CPU"], OVERHEAD, 0.0)
    with pytest.raises(ValueError, match="median ≤ p99"):
        Timing(2e-3, 1e-3)
