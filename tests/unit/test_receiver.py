"""The receiver's checks (gateway/receiver/verify.py), on requests signed
as the gateway signs them (gateway/signing.py), without I/O."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st
from multidict import CIMultiDict

from gateway.receiver import MemoryFences, Refused, Verifier
from gateway.signing import fence_signature, webhook_signature

SECRET = "whsec_" + base64.b64encode(b"receiver-test-secret-32-bytes-ok").decode()
OTHER = "whsec_" + base64.b64encode(b"another-secret-of-thirty-two-byt").decode()
NOW = 1_700_000_000
BODY = b'{"note": "hi"}'


def signed(resource: str = "lead:1", fence: int = 7, *, secret: str = SECRET,
           ts: int = NOW, body: bytes = BODY) -> dict[str, str]:
    return {
        "webhook-id": "abc123", "webhook-timestamp": str(ts),
        "webhook-signature": webhook_signature(secret, "abc123", ts, body),
        "Fence-Resource": resource, "Fence-Token": str(fence),
        "Fence-Signature": fence_signature(secret, "abc123", ts, resource, fence, body),
    }


def verifier(secrets: str | list[str] = SECRET, **kw: float) -> Verifier:
    return Verifier(secrets, MemoryFences(), clock=lambda: NOW, **kw)


def refused(v: Verifier, headers: dict[str, str], body: bytes = BODY) -> str:
    with pytest.raises(Refused) as e:
        v.authenticate(headers, body)
    return e.value.check


def test_a_request_signed_as_the_gateway_signs_it_passes() -> None:
    d = verifier().authenticate(signed(), BODY)
    assert (d.msg_id, d.timestamp, d.resource, d.fence, d.body) == \
        ("abc123", NOW, "lead:1", 7, BODY)


def test_any_v1_signature_under_any_secret_passes() -> None:
    """Several signatures in one header, several secrets: a rotation."""
    h = signed(secret=OTHER)
    h["webhook-signature"] = "v1,bm9wZQ== v1a,xyz " + h["webhook-signature"]
    h["Fence-Signature"] = h["Fence-Signature"] + " v1,bm9wZQ=="
    assert verifier([SECRET, OTHER]).authenticate(h, BODY).fence == 7
    assert refused(verifier(SECRET), h) == "bad_signature"


def test_the_timestamp_must_be_within_the_tolerance_either_way() -> None:
    v = verifier(tolerance_seconds=300)
    assert v.authenticate(signed(ts=NOW - 300), BODY).timestamp == NOW - 300
    assert refused(v, signed(ts=NOW - 301)) == "stale_timestamp"
    assert refused(v, signed(ts=NOW + 301)) == "stale_timestamp"
    assert refused(v, {**signed(), "webhook-timestamp": "soon"}) == "stale_timestamp"


def test_each_check_names_what_failed() -> None:
    v, h = verifier(), signed()
    assert refused(v, {k: x for k, x in h.items() if k != "webhook-id"}) == "missing_signature"
    assert refused(v, h, BODY + b" ") == "bad_signature"
    assert refused(v, {k: x for k, x in h.items() if k != "Fence-Token"}) == "missing_fence"
    assert refused(v, {k: x for k, x in h.items() if k != "Fence-Signature"}) \
        == "bad_fence_signature"
    assert refused(v, {**h, "Fence-Token": "8"}) == "bad_fence_signature"
    assert refused(v, {**h, "Fence-Resource": "lead:2"}) == "bad_fence_signature"
    # the Standard Webhooks signature cannot pass for the fence one
    assert refused(v, {**h, "Fence-Signature": h["webhook-signature"]}) == "bad_fence_signature"


def test_a_second_copy_of_a_signed_header_is_refused() -> None:
    h = CIMultiDict(signed())
    h.add("fence-token", "99")
    assert refused(verifier(), h) == "missing_fence"  # type: ignore[arg-type]


def test_a_fence_is_checked_in_any_letter_case_of_its_headers() -> None:
    h = {k.upper(): v for k, v in signed().items()}
    assert verifier().authenticate(h, BODY).fence == 7


async def test_lower_fences_are_refused_equal_and_higher_pass() -> None:
    v = verifier()
    assert (await v.verify(signed(fence=7), BODY)).fence == 7
    assert (await v.verify(signed(fence=7), BODY)).fence == 7
    with pytest.raises(Refused) as e:
        await v.verify(signed(fence=6), BODY)
    assert (e.value.check, e.value.status, e.value.document()["current_fence"]) == \
        ("stale_fence", 412, 7)
    assert (await v.verify(signed(fence=9), BODY)).fence == 9
    assert (await v.verify(signed("lead:2", fence=1), BODY)).fence == 1  # per resource


@given(st.lists(st.integers(min_value=0, max_value=2**63 - 1), max_size=30))
async def test_the_memory_store_passes_a_fence_iff_none_higher_passed(
    fences: list[int],
) -> None:
    store, highest = MemoryFences(), -1
    for f in fences:
        passed = await store.advance("r", f) == f
        assert passed == (f >= highest)
        highest = max(highest, f)
    assert store.highest("r") == (highest if fences else None)


async def test_a_failing_store_is_refused_as_unavailable() -> None:
    class Broken:
        async def advance(self, resource: str, fence: int) -> int:
            raise OSError("connection refused")

    v = Verifier(SECRET, Broken(), clock=lambda: NOW)
    with pytest.raises(Refused) as e:
        await v.verify(signed(), BODY)
    assert (e.value.check, e.value.status) == ("unavailable", 503)
    assert "connection refused" not in e.value.detail


def test_a_verifier_needs_a_secret() -> None:
    with pytest.raises(ValueError):
        Verifier([], MemoryFences())
