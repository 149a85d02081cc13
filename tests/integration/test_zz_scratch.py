import asyncio
from tests.integration.conftest import Gw

async def test_scratch(gw: Gw):
    results = []
    for i in range(15):
        a = await gw.leases.claim(f"run:a{i}", ttl=30)
        b = await gw.leases.claim(f"run:b{i}", ttl=30)
        key = f"race-{i}"
        ra, rb = await asyncio.gather(
            gw.post("/v1/http/hook/x", gw.headers(a, key), json={"n": 1}),
            gw.post("/v1/http/hook/x", gw.headers(b, key), json={"n": 1}))
        results.append((ra[0], rb[0], (ra[2].get("code") if isinstance(ra[2], dict) else None), (rb[2].get("code") if isinstance(rb[2], dict) else None)))
    print("RESULTS", results, len(gw.hook.deliveries))
