"""One tenant floods a real `querygate serve` process; another tenant's queries stay inside
their deadline and are never refused, while the flooder is told 429.

The load is `bench/tenant_flood.py`'s (four loops of big document writes and 24 query loops
for the flooder, two query loops for the victim, ~12 s, loopback only), in its `backoff`
scenario; the bench prints the figures, this test asserts the behaviour: every victim request
answered 200 within its deadline, no victim 429, at least one flooder 429.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bench.tenant_flood import DEADLINE_S, OVERRIDES, flood
from tests.fixtures.gateway import GatewayProcess, start_gateway, stop_gateway

LOAD_S = 12.0


@pytest.fixture(scope="module")
def loaded_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    gw = start_gateway(tmp_path_factory.mktemp("admission-load"), None, overrides=OVERRIDES)
    yield gw
    stop_gateway(gw)


async def test_a_flooding_tenant_cannot_push_another_past_its_deadline(
    loaded_gateway: GatewayProcess,
) -> None:
    result = await flood(loaded_gateway, LOAD_S, backoff_s=0.05)
    print(result.summary())
    assert result.victim_latency_s, "the victim sent nothing"
    # Within the deadline by the gateway's own clock (timings_ms.total): the latency this
    # client sees also counts its own event loop, busy with the flood, so it is printed, not
    # asserted; time queued before the gateway's clock starts is in the printed figure only.
    assert set(result.victim) == {200}, result.victim
    assert max(result.victim_served_s) < DEADLINE_S
    assert result.flood_query[429] + result.flood_write[429] > 0
