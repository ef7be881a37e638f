"""The circuit breakers' state machines (one per model and one per tenant of it), on an injected
clock (no sleeping)."""

from __future__ import annotations

from backends.llm.breakers import Admission, CircuitBreaker, ModelBreaker, Pass

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


# --- per tenant: one tenant's failures cool a model down for that tenant alone -----------------


def _model(threshold: int = 3) -> tuple[ModelBreaker, FakeClock, list[tuple[str | None, bool]]]:
    clock = FakeClock()
    events: list[tuple[str | None, bool]] = []
    breaker = ModelBreaker(threshold, COOLDOWN_S, clock, lambda *e: events.append(e))
    return breaker, clock, events


def _call(breaker: ModelBreaker, tenant: str, verdict: bool | None) -> Pass:
    admitted = breaker.admit(tenant)
    assert admitted is not None, f"{tenant} was skipped"
    breaker.record(admitted, verdict)
    return admitted


def test_one_tenants_failures_cool_the_model_for_it_alone() -> None:
    breaker, _, events = _model()
    _call(breaker, "quiet", True)  # two tenants have used the model
    for _ in range(10):
        if breaker.admit("noisy") is None:
            break
        breaker.record(Pass("noisy", Admission.CALL, Admission.CALL), False)
    assert breaker.admit("noisy") is None  # it stopped paying retries after 3
    assert events == [("noisy", True)] and breaker.tenants_cooling() == 1
    assert not breaker.shared.is_open
    assert _call(breaker, "quiet", True) == Pass("quiet", Admission.CALL, Admission.CALL)


def test_failures_of_two_tenants_open_it_for_everyone_as_fast_as_one_tenants_did() -> None:
    breaker, _, events = _model()
    _call(breaker, "a", False)
    _call(breaker, "b", False)
    _call(breaker, "a", False)  # the third consecutive failure, as before tenants counted
    assert events == [(None, True)]
    assert breaker.admit("c") is None


def test_a_cooled_tenants_failures_and_one_failure_of_another_open_it() -> None:
    breaker, _, _ = _model()
    _call(breaker, "b", True)
    _call(breaker, "a", False)
    _call(breaker, "a", False)
    _call(breaker, "a", False)
    assert not breaker.shared.is_open
    _call(breaker, "b", False)  # the model failed another tenant's call too: evidence
    assert breaker.shared.is_open and breaker.admit("c") is None


def test_another_tenants_success_restarts_the_shared_count() -> None:
    breaker, _, _ = _model()
    _call(breaker, "a", False)
    _call(breaker, "a", False)
    _call(breaker, "b", True)
    _call(breaker, "b", False)
    _call(breaker, "c", False)
    assert not breaker.shared.is_open


def test_a_single_tenant_opens_it_at_the_threshold() -> None:
    breaker, clock, events = _model()
    for _ in range(3):
        _call(breaker, "solo", False)
    assert breaker.shared.is_open and events == [("solo", True), (None, True)]
    assert breaker.admit("solo") is None
    clock.now += COOLDOWN_S
    probe = _call(breaker, "solo", False)  # its failed probe opens it again
    assert probe.is_probe and breaker.shared.seconds_left() == COOLDOWN_S
    clock.now += COOLDOWN_S
    _call(breaker, "solo", True)
    assert not breaker.shared.is_open and breaker.tenants_cooling() == 0


def test_a_second_tenant_withdraws_a_cooldown_that_stood_on_the_first_ones_failures() -> None:
    breaker, _, events = _model()
    for _ in range(3):
        _call(breaker, "first", False)
    assert breaker.shared.is_open
    assert _call(breaker, "second", True) == Pass("second", Admission.CALL, Admission.CALL)
    assert events == [("first", True), (None, True), (None, False)]
    assert breaker.admit("first") is None  # still cooled for the tenant that failed


def test_a_cooled_tenants_failing_probe_cannot_hold_the_model_for_the_others() -> None:
    breaker, clock, _ = _model()
    _call(breaker, "b", True)
    for tenant in "aaab":  # "a" is cooled alone, then "b" fails too: open for everyone
        _call(breaker, tenant, False)
    assert breaker.shared.is_open and breaker.tenants_cooling() == 1
    clock.now += COOLDOWN_S
    for _ in range(3):  # "a" alone keeps failing (its own content), once a cooldown
        probe = _call(breaker, "a", False)
        assert probe.is_probe
        clock.now += COOLDOWN_S
    # the shared breaker waited, half-open, for another tenant's probe: that one decides
    probe = _call(breaker, "c", True)
    assert probe.shared is Admission.PROBE and not breaker.shared.is_open


def test_tenant_breakers_are_forgotten_once_idle_or_stale() -> None:
    breaker, clock, events = _model()
    _call(breaker, "b", True)
    _call(breaker, "a", False)
    _call(breaker, "a", True)
    for _ in range(3):
        _call(breaker, "gone", False)
    assert breaker.tenants_cooling() == 1
    clock.now += 2 * COOLDOWN_S  # nobody probed it for a whole cooldown past its due time
    _call(breaker, "b", True)
    assert breaker.tenants_cooling() == 0 and events[-1] == ("gone", False)
    assert breaker._own == {}  # bounded: nothing kept for idle tenants


def test_a_cooled_tenants_late_failing_calls_do_not_keep_the_model_from_the_others() -> None:
    breaker, clock, _ = _model()
    _call(breaker, "b", True)
    late = [breaker.admit("a") for _ in range(20)]  # "a"'s prompts, all out at once
    assert all(p is not None for p in late)
    for admitted in late[:3]:  # they run to the timeout: "a" is cooled alone
        assert admitted is not None
        breaker.record(admitted, False)
    _call(breaker, "b", False)  # one failure of another tenant's: open for everyone
    assert breaker.shared.is_open
    for admitted in late[3:]:  # "a"'s other calls time out one by one, 10 s apart
        clock.now += 10
        assert admitted is not None
        breaker.record(admitted, False)
    # They were "a"'s pattern, not news about the model: the shared cooldown ended 30 s
    # after it opened (it was restarted by each, holding "b" off for 170 s)
    assert breaker.shared.seconds_left() == 0
    assert _call(breaker, "b", True).shared is Admission.PROBE
