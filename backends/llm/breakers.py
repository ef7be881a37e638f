"""Circuit breakers for the models of a tier's chain: when a failing model is skipped.

A `CircuitBreaker` is one cooldown (closed, open, half-open). A `ModelBreaker` is one model's
set of them: one per tenant and the shared one every tenant obeys, so that one tenant's
failures cool the model down for that tenant alone and a model is taken from everyone only
when it fails for more than one tenant. `backends.llm.tiers` asks them before every call and
tells them every call's verdict.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum


class Admission(Enum):
    """How a breaker let a call through."""

    CALL = "call"
    PROBE = "probe"  # the one call let through to a cooling model


class CircuitBreaker:
    """One cooldown: closed, open (skipped), half-open (one probe at a time).

    `threshold` consecutive failures open it (0: never). After `cooldown_s` it admits one probe;
    the probe's success closes it, its failure opens it again. A verdict of None (a refused or
    cancelled call) changes nothing but frees the probe slot. Any call's success closes it, and
    any call's failure while it is open restarts the cooldown: late answers are evidence too.
    `may_open=False` counts a failure without letting it open a closed breaker.
    """

    def __init__(self, threshold: int, cooldown_s: float, clock: Callable[[], float]) -> None:
        self._threshold = threshold
        self._cooldown_s = cooldown_s
        self._clock = clock
        self._failures = 0
        self._open_until: float | None = None  # None while closed
        self._probing = False

    @property
    def is_open(self) -> bool:
        """Not closed: open or half-open."""
        return self._open_until is not None

    @property
    def is_idle(self) -> bool:
        """Closed with no failure counted: no different from a new breaker."""
        return self._open_until is None and self._failures == 0

    @property
    def failures(self) -> int:
        return self._failures

    def seconds_left(self) -> float:
        """Until a probe may go: 0 when closed or half-open."""
        if self._open_until is None:
            return 0.0
        return max(0.0, self._open_until - self._clock())

    def stale(self) -> bool:
        """Open, with no probe for a whole cooldown past its due time: nobody is asking."""
        return (
            self._open_until is not None
            and not self._probing
            and self._clock() >= self._open_until + self._cooldown_s
        )

    def admit(self) -> Admission | None:
        """Whether a call may go now (None: skip this model), and whether it is the probe."""
        if self._open_until is None:
            return Admission.CALL
        if self._probing or self._clock() < self._open_until:
            return None
        self._probing = True
        return Admission.PROBE

    def record(self, admitted: Admission, verdict: bool | None, *, may_open: bool = True) -> bool:
        """Take a call's outcome (True ok, False failed, None no verdict); True if it flipped."""
        was_open = self.is_open
        if admitted is Admission.PROBE:
            self._probing = False
        if verdict is True:
            self._failures = 0
            self._open_until = None
        elif verdict is False:
            self._failures += 1
            if was_open or (may_open and 0 < self._threshold <= self._failures):
                self._open_until = self._clock() + self._cooldown_s
        return self.is_open is not was_open

    def close(self) -> bool:
        """Close it, the failures still counted (the evidence was judged too weak to open it);
        True if it was open. A probe still out records its verdict as a late call's."""
        was_open = self.is_open
        self._open_until, self._probing = None, False
        return was_open


@dataclass(frozen=True, slots=True)
class Pass:
    """How a tenant's call was let through: by the model's shared breaker and by its own."""

    tenant: str
    shared: Admission
    own: Admission

    @property
    def is_probe(self) -> bool:
        return Admission.PROBE in (self.shared, self.own)


class ModelBreaker:
    """One model's breakers: one per tenant, and the shared one every tenant obeys.

    A tenant's own `threshold` consecutive failed calls cool the model down for that tenant
    alone (skipped, then probed by that tenant's requests, as `CircuitBreaker`): it stops paying
    retries on a pattern of its own (prompts the upstream times out on or 5xx's) and nobody
    else notices. The shared breaker counts every tenant's failed calls since the model last
    answered anyone, and opens once they are `threshold` or more *and come from at least two
    tenants*: the model failing for more than one tenant is the model failing. One tenant's
    failures, however many, never open it, so a tenant cannot take a model away from the others.

    The exceptions, each so that one tenant's failures cannot keep the model away:
    - a tenant whose own breaker is open is no news about the model: its failed calls (probes,
      late calls admitted before it cooled) do not count in the shared run nor restart an open
      shared cooldown, and while the shared breaker is open its failed probe leaves the shared
      breaker half-open for another tenant to probe, rather than opening it again;
    - while only one tenant has ever asked for the model (a single-tenant deployment, or a
      process that has seen one tenant so far), that tenant's failures are all the evidence
      there is and open the shared breaker at `threshold`, as if tenants did not exist. The
      first call of a second tenant ends that: a shared cooldown opened on one tenant's
      evidence is withdrawn and the newcomer's call goes through.

    Tenant breakers live only while they hold a failure; one left open with nobody probing
    it for a whole cooldown past its due time is forgotten, so their number is bounded by the
    tenants that are failing now. `on_change(tenant, is_open)` hears every flip: tenant None is
    the shared breaker.
    """

    def __init__(
        self,
        threshold: int,
        cooldown_s: float,
        clock: Callable[[], float],
        on_change: Callable[[str | None, bool], None] | None = None,
    ) -> None:
        self._threshold = threshold
        self._cooldown_s = cooldown_s
        self._clock = clock
        self._on_change = on_change
        self.shared = CircuitBreaker(threshold, cooldown_s, clock)
        self._own: dict[str, CircuitBreaker] = {}
        # The tenants whose failures are in the shared run (two are enough to know).
        self._run: set[str] = set()
        self._first_tenant: str | None = None
        self._several_tenants = False

    def tenants_cooling(self) -> int:
        """Tenants this model is cooled down for alone (by their own breaker)."""
        return sum(1 for b in self._own.values() if b.is_open)

    def seconds_left(self, tenant: str) -> float:
        """Until `tenant` may call this model again (0: half-open, a probe may go)."""
        own = self._own.get(tenant)
        return max(self.shared.seconds_left(), own.seconds_left() if own is not None else 0.0)

    def admit(self, tenant: str) -> Pass | None:
        """Whether `tenant`'s call may go now (None: skip this model for it)."""
        self._meet(tenant)
        own = self._own.get(tenant)
        if own is not None and own.seconds_left() > 0:
            return None  # cooled alone: not even a shared probe before its own cooldown ends
        shared = self.shared.admit()
        if shared is None:
            return None
        own_admitted = own.admit() if own is not None else Admission.CALL
        if own_admitted is None:  # its own probe is out already
            self.shared.record(shared, None)
            return None
        return Pass(tenant, shared, own_admitted)

    def record(self, admitted: Pass, verdict: bool | None) -> None:
        """Take the outcome of a call `admit` let through."""
        tenant = admitted.tenant
        own = self._own.get(tenant)
        cooled = own is not None and own.is_open  # before this call's verdict
        if own is None and verdict is False:
            own = self._own[tenant] = CircuitBreaker(self._threshold, self._cooldown_s, self._clock)
        if own is not None:
            if own.record(admitted.own, verdict) and self._on_change is not None:
                self._on_change(tenant, own.is_open)
            if own.is_idle:
                del self._own[tenant]
        self._record_shared(admitted, verdict, cooled)

    def _record_shared(self, admitted: Pass, verdict: bool | None, cooled: bool) -> None:
        # Its probes, and its late calls too (admitted before it cooled, failing one by one up
        # to the upstream's timeout): each restarted an open shared cooldown, so one tenant's
        # pattern kept the model from everyone for as long as its calls kept failing.
        known_pattern = cooled and self._several_tenants
        if verdict is False and known_pattern:
            # A cooled tenant's call failing is about that tenant, not the model: it counts for
            # its own breaker only, and a shared probe it carried is handed back, unspent.
            self.shared.record(admitted.shared, None)
            return
        if verdict is True:
            self._run.clear()
        elif verdict is False:
            self._run.add(admitted.tenant)
        spread = len(self._run) >= 2 or not self._several_tenants
        if self.shared.record(admitted.shared, verdict, may_open=spread):
            self._changed(None, self.shared.is_open)

    def _meet(self, tenant: str) -> None:
        """Note who asks; forget tenant breakers nobody probes any more."""
        if self._first_tenant is None:
            self._first_tenant = tenant
        elif not self._several_tenants and tenant != self._first_tenant:
            self._several_tenants = True
            # The shared cooldown stood on one tenant's evidence: withdraw it (the failures
            # stay counted: one of another tenant's will open it again).
            if len(self._run) < 2 and self.shared.close():
                self._changed(None, False)
        if self._own:
            for name in [t for t, b in self._own.items() if b.stale()]:
                del self._own[name]
                self._changed(name, False)

    def _changed(self, tenant: str | None, is_open: bool) -> None:
        if self._on_change is not None:
            self._on_change(tenant, is_open)
