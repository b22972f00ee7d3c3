"""When each device will have finished what it was given: for launching a partial batch just in time.

A device runs its batches one after another (one stream), so a partial batch launched while
another runs only waits there, staged, and the requests that arrive meanwhile cannot join it:
under load the batches stay small and the device computes more of them, each with its fixed
cost. Launched when the running batch is about to end instead — its expected end less the time
staging takes — the batch carries everything that arrived until then, and the device still
never waits (bench/results/2026-12-01-cpu-sim-gpu-launch.md).

The estimates are moving averages of what the batches measured: each bucket's device seconds
(engine.run's figure) and the seconds from a batch's launch until it is queued on the device
(staging its rows). Until a bucket has been measured its batches count for nothing, and the
batcher falls back to its `max_delay_s` rule alone. The same figures tell the batcher which bucket
a busy device computes the most rows a second with (`estimate_s`, app/batching/batcher.py).
"""

from __future__ import annotations

SMOOTHING = 0.1  # each new figure's weight in its moving average (~10 batches)
MARGIN_S = 0.0002  # launch this much earlier still: the hand-back's own latency


class DeviceClock:
    def __init__(self, devices: int) -> None:
        self._compute_s: dict[int, float] = {}  # bucket → device seconds a batch of it takes
        self._stage_s = 0.0  # launch → queued on the device
        self._free_at = [0.0] * devices  # time.monotonic() at which each device should be done

    def expected_s(self, bucket: int) -> float:
        return self._compute_s.get(bucket, 0.0)

    def estimate_s(self, bucket: int) -> float:
        """A bucket's device seconds, for comparing buckets: measured, or else a hopeful guess from
        the nearest measured bucket (no slower if larger, faster by its rows if smaller), so that
        the batcher tries it once and then knows; 0 before any batch."""
        measured = self._compute_s.get(bucket)
        if measured is not None:
            return measured
        if not self._compute_s:
            return 0.0
        nearest = min(self._compute_s, key=lambda b: abs(b - bucket))
        seconds = self._compute_s[nearest]
        return seconds * bucket / nearest if bucket < nearest else seconds

    def longest_s(self) -> float:
        """The longest batch measured (0 before the first): the most a wrong estimate may hold one back."""
        return max(self._compute_s.values(), default=0.0)

    def launched(self, device: int, bucket: int, now: float) -> None:
        """A batch of `bucket` rows goes to `device`: it runs after what is there, once staged."""
        self._free_at[device] = max(self._free_at[device], now + self._stage_s) + self.expected_s(bucket)

    def staged(self, seconds: float) -> None:
        self._stage_s += SMOOTHING * (seconds - self._stage_s) if self._stage_s else seconds

    def finished(self, device: int, bucket: int, seconds: float | None, now: float, still_there: list[int]) -> None:
        """A batch came back (`seconds` of device time; None if it failed); `still_there`: the
        buckets of the batches still in flight on that device, which run from now."""
        if seconds is not None and seconds > 0:
            old = self._compute_s.get(bucket)
            self._compute_s[bucket] = seconds if old is None else old + SMOOTHING * (seconds - old)
        self._free_at[device] = now + sum(self.expected_s(b) for b in still_there)

    def launch_at(self, devices: list[int]) -> float:
        """When to launch a partial batch onto the soonest free of `devices` (those with a free
        slot): early enough to be staged by then. In the past when nothing is known."""
        return min(self._free_at[d] for d in devices) - self._stage_s - MARGIN_S
