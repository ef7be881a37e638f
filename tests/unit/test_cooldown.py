"""The per-model circuit breaker's state machine, on an injected clock (no sleeping)."""

from __future__ import annotations

from backends.llm.litellm_tiers import Admission, CircuitBreaker

COOLDOWN_S = 30.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _breaker(threshold: int = 3) -> tuple[CircuitBreaker, FakeClock]:
    clock = FakeClock()
    return CircuitBreaker(threshold, COOLDOWN_S, clock), clock


def _fail(breaker: CircuitBreaker, times: int = 1) -> None:
    for _ in range(times):
        admitted = breaker.admit()
        assert admitted is not None
        breaker.record(admitted, False)


def _open(threshold: int = 3) -> tuple[CircuitBreaker, FakeClock]:
    breaker, clock = _breaker(threshold)
    _fail(breaker, threshold)
    assert breaker.is_open
    return breaker, clock


def test_consecutive_failures_open_it_at_the_threshold_and_not_before() -> None:
    breaker, _ = _breaker(threshold=3)
    _fail(breaker, 2)
    assert not breaker.is_open
    admitted = breaker.admit()
    assert admitted is Admission.CALL
    assert breaker.record(admitted, False) is True  # flipped
    assert breaker.is_open and breaker.admit() is None


def test_a_success_resets_the_count_of_consecutive_failures() -> None:
    breaker, _ = _breaker(threshold=2)
    _fail(breaker)
    breaker.record(Admission.CALL, True)
    _fail(breaker)
    assert not breaker.is_open


def test_a_call_without_verdict_neither_counts_nor_resets() -> None:
    breaker, _ = _breaker(threshold=2)
    _fail(breaker)
    breaker.record(Admission.CALL, None)
    assert not breaker.is_open
    _fail(breaker)
    assert breaker.is_open


def test_threshold_zero_never_opens() -> None:
    breaker, _ = _breaker(threshold=0)
    _fail(breaker, 50)
    assert not breaker.is_open and breaker.admit() is Admission.CALL


def test_an_open_breaker_skips_until_the_cooldown_has_passed() -> None:
    breaker, clock = _open()
    clock.now += COOLDOWN_S - 0.5
    assert breaker.admit() is None
    assert breaker.seconds_left() == 0.5


def test_half_open_admits_exactly_one_probe_at_a_time() -> None:
    breaker, clock = _open()
    clock.now += COOLDOWN_S
    assert breaker.admit() is Admission.PROBE
    assert [breaker.admit() for _ in range(3)] == [None, None, None]


def test_a_successful_probe_closes_it() -> None:
    breaker, clock = _open()
    clock.now += COOLDOWN_S
    assert breaker.record(Admission.PROBE, True) is True
    assert not breaker.is_open and breaker.admit() is Admission.CALL


def test_a_failed_probe_opens_it_for_another_full_cooldown() -> None:
    breaker, clock = _open()
    clock.now += COOLDOWN_S + 5
    admitted = breaker.admit()
    assert admitted is Admission.PROBE
    assert breaker.record(admitted, False) is False  # still open: no flip to report
    assert breaker.seconds_left() == COOLDOWN_S
    assert breaker.admit() is None


def test_a_probe_without_verdict_frees_the_slot_for_the_next_probe() -> None:
    breaker, clock = _open()
    clock.now += COOLDOWN_S
    breaker.record(Admission.PROBE, None)  # e.g. the client went away mid-probe
    assert breaker.is_open
    assert breaker.admit() is Admission.PROBE


def test_a_late_call_ending_without_verdict_does_not_free_the_probe_slot() -> None:
    breaker, clock = _open()
    clock.now += COOLDOWN_S
    assert breaker.admit() is Admission.PROBE
    breaker.record(Admission.CALL, None)  # admitted before the breaker opened
    assert breaker.admit() is None
