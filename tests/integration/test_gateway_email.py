"""Email effects through the gateway to a real aiosmtpd sink."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from leases import LeaseClient
from tests.integration.conftest import OTHER_KEY, PROVIDER_TIMEOUT, Gw
from tests.support.lapse import lapse
from tests.support.waiting import until


async def test_an_email_is_sent_once_with_a_stable_message_id(gw: Gw) -> None:
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    before = await gw.metric("fencegate_effects_total", provider="mail", outcome="succeeded")
    status, headers, body = await gw.email(lease, "welcome-1")
    assert status == 200, body
    assert body["status"] == "sent" and body["provider"] == "mail"
    assert headers["Idempotency-Key"] == "welcome-1"
    assert len(gw.smtp.deliveries) == 1
    msg = gw.smtp.deliveries[0]
    assert msg.header("Message-ID") == body["message_id"]
    assert msg.header("Fence-Token") == str(lease.fence)
    assert msg.recipients == ["lead@example.com"]
    after = await gw.metric("fencegate_effects_total", provider="mail", outcome="succeeded")
    assert after == before + 1


async def test_a_repeat_is_replayed_and_nothing_is_sent_again(gw: Gw) -> None:
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    first = await gw.email(lease, "k-replay")
    before = await gw.metric("fencegate_effects_total", provider="mail", outcome="replayed")
    second = await gw.email(lease, "k-replay",
                            body={"to": ["lead@example.com"], "subject": "Hello"})
    assert second[0] == 200 and second[1]["Idempotent-Replayed"] == "true"
    assert second[2] == first[2]
    assert second[1]["Idempotency-Key"] == "k-replay"
    assert len(gw.smtp.deliveries) == 1
    assert await gw.metric("fencegate_effects_total", provider="mail",
                           outcome="replayed") == before + 1


async def test_key_order_and_spacing_do_not_make_a_different_request(gw: Gw) -> None:
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    h = gw.headers(lease, "k-canon")
    a = b'{"from":"a@example.com","to":["b@example.com"],"subject":"S","text":"T"}'
    b = b'{ "text": "T", "subject": "S",\n "to": [ "b@example.com" ], "from": "a@example.com" }'
    s1, _, _ = await gw.post("/v1/email", {**h, "Content-Type": "application/json"}, data=a)
    s2, h2, _ = await gw.post("/v1/email", {**h, "Content-Type": "application/json"}, data=b)
    assert (s1, s2) == (200, 200) and h2["Idempotent-Replayed"] == "true"
    assert len(gw.smtp.deliveries) == 1


async def test_the_same_key_with_a_different_email_is_refused(gw: Gw) -> None:
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    await gw.email(lease, "k-mismatch")
    status, _, body = await gw.email(lease, "k-mismatch", body={"subject": "Different"})
    assert status == 422 and body["code"] == "idempotency_key_reused"
    assert len(gw.smtp.deliveries) == 1


async def test_concurrent_duplicates_send_exactly_once(
    make_gw: Callable[..., Awaitable[Gw]],
) -> None:
    # the message the first one sends is held until all ten have answered
    # (nine of them while it is in flight)
    gw = await make_gw(providers={"mail": {"timeout_seconds": 60}})
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    gw.smtp.hold = asyncio.Event()
    before = await gw.metric("fencegate_effects_total", provider="mail", outcome="in_progress")
    calls = [asyncio.ensure_future(gw.email(lease, "k-dup")) for _ in range(10)]
    try:
        await until(lambda: sum(c.done() for c in calls) == 9, "nine of ten answered")
    finally:
        gw.smtp.hold.set()
    results = await asyncio.gather(*calls)
    statuses = sorted(r[0] for r in results)
    assert statuses.count(200) == 1 and statuses.count(409) == 9
    for status, headers, body in results:
        if status == 409:
            assert body["code"] == "effect_in_progress"
            assert int(headers["Retry-After"]) >= 1
    assert len(gw.smtp.deliveries) == 1
    assert await gw.metric("fencegate_effects_total", provider="mail",
                           outcome="in_progress") == before + 9


async def test_the_zombie_is_refused_and_the_sink_holds_one_message(gw: Gw) -> None:
    """A claims, stalls past its lease; B claims and sends; A wakes and sends."""
    a = LeaseClient(pool=gw.pool, owner="worker-a")
    b = LeaseClient(pool=gw.pool, owner="worker-b")
    lease_a = await a.claim("run:zombie", ttl=30)
    assert lease_a is not None
    await lapse(gw.pool)  # A's stall, past its ttl
    lease_b = await b.claim("run:zombie", ttl=30)
    assert lease_b is not None
    assert (await gw.email(lease_b, "b-send"))[0] == 200
    before = await gw.metric("fencegate_fence_rejections_total", provider="mail",
                             reason="stale_fence")
    status, _, body = await gw.email(lease_a, "a-send")
    assert status == 412 and body["code"] == "stale_fence"
    assert body["current_fence"] == lease_b.fence
    assert len(gw.smtp.deliveries) == 1
    assert gw.smtp.deliveries[0].header("Fence-Token") == str(lease_b.fence)
    assert await gw.metric("fencegate_fence_rejections_total", provider="mail",
                           reason="stale_fence") == before + 1


async def test_the_four_fence_verdicts_are_told_apart(gw: Gw) -> None:
    reasons = ("no_lease", "invalid_fence", "lease_expired", "stale_fence")
    before = {r: await gw.metric("fencegate_fence_rejections_total", provider="mail",
                                 reason=r) for r in reasons}
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    status, _, body = await gw.email(None, "k-none", resource="run:never", fence=5)
    assert (status, body["code"]) == (412, "no_lease")
    status, _, body = await gw.email(lease, "k-high", fence=lease.fence + 1)
    assert (status, body["code"]) == (412, "invalid_fence")
    assert await lease.release()
    status, _, body = await gw.email(lease, "k-released")
    assert (status, body["code"]) == (412, "lease_expired")
    again = await gw.leases.claim("run:1", ttl=30)
    assert again is not None
    status, _, body = await gw.email(lease, "k-stale")
    assert (status, body["code"]) == (412, "stale_fence")
    assert gw.smtp.deliveries == []
    for r in reasons:
        assert await gw.metric("fencegate_fence_rejections_total", provider="mail",
                               reason=r) == before[r] + 1, r


async def test_smtp_permanent_refusal_is_final_and_replayed(gw: Gw) -> None:
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    gw.smtp.data_reply = "550 5.1.1 mailbox unavailable"
    status, headers, body = await gw.email(lease, "k-550")
    assert status == 422 and body["code"] == "provider_rejected"
    gw.smtp.data_reply = None
    status, headers, body = await gw.email(lease, "k-550")
    assert status == 422 and headers["Idempotent-Replayed"] == "true"
    assert gw.smtp.deliveries == []


async def test_smtp_temporary_refusal_frees_the_key(gw: Gw) -> None:
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    before = await gw.metric("fencegate_effects_total", provider="mail",
                             outcome="provider_error")
    gw.smtp.data_reply = "451 4.3.0 try again later"
    status, _, body = await gw.email(lease, "k-451")
    assert status == 502 and body["code"] == "provider_error"
    gw.smtp.data_reply = None
    status, headers, _ = await gw.email(lease, "k-451")
    assert status == 200 and "Idempotent-Replayed" not in headers
    assert len(gw.smtp.deliveries) == 1
    assert await gw.metric("fencegate_effects_total", provider="mail",
                           outcome="provider_error") == before + 1


async def test_a_deferred_recipient_sends_to_nobody(gw: Gw) -> None:
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    gw.smtp.rcpt_replies = {"b@example.com": "450 4.2.1 mailbox busy"}
    status, _, body = await gw.email(lease, "k-rcpt", body={
        "to": ["a@example.com", "b@example.com"]})
    assert status == 502 and body["code"] == "provider_error"
    assert gw.smtp.deliveries == []


async def test_an_smtp_timeout_leaves_the_outcome_unknown_until_resolved(gw: Gw) -> None:
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    gw.smtp.data_delay = PROVIDER_TIMEOUT + 0.5
    status, _, body = await gw.email(lease, "k-timeout")
    assert status == 504 and body["code"] == "provider_timeout"
    gw.smtp.data_delay = 0
    status, _, body = await gw.email(lease, "k-timeout")
    assert status == 409 and body["code"] == "effect_outcome_unknown"
    h = {"Authorization": gw.headers()["Authorization"]}
    status, _, body = await gw.request("GET", "/v1/effects/k-timeout", h)
    assert status == 200 and body["state"] == "unknown" and body["fence"] == lease.fence
    assert body["resolvable_in_seconds"] > 0
    # not yet: until its deadline, the attempt may still be under way
    status, headers, body = await gw.post("/v1/effects/k-timeout/resolve", h,
                                          json={"outcome": "not_sent"})
    assert (status, body["code"]) == (409, "effect_in_progress")
    assert int(headers["Retry-After"]) >= 1
    await gw.past_deadline("k-timeout")
    status, _, body = await gw.post("/v1/effects/k-timeout/resolve", h,
                                    json={"outcome": "not_sent"})
    assert status == 200
    # the first attempt's message is at the sink (recorded when its DATA
    # ended; the attempt's reset cancelled the late answer)
    await until(lambda: len(gw.smtp.deliveries) >= 1, "the first attempt at the sink")
    sent_late = len(gw.smtp.deliveries)
    status, _, _ = await gw.email(lease, "k-timeout")
    assert status == 200
    assert len(gw.smtp.deliveries) == sent_late + 1


async def test_resolving_as_sent_replays_afterwards(gw: Gw) -> None:
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    gw.smtp.data_delay = PROVIDER_TIMEOUT + 0.2
    assert (await gw.email(lease, "k-sent"))[0] == 504
    await gw.past_deadline("k-sent")
    h = {"Authorization": gw.headers()["Authorization"]}
    assert (await gw.post("/v1/effects/k-sent/resolve", h, json={"outcome": "sent"}))[0] == 200
    status, headers, _ = await gw.email(lease, "k-sent")
    assert status == 200 and headers["Idempotent-Replayed"] == "true"
    status, _, body = await gw.post("/v1/effects/k-sent/resolve", h, json={"outcome": "sent"})
    assert status == 409 and body["code"] == "effect_not_unknown"


async def test_header_injection_is_a_bad_request_and_sends_nothing(gw: Gw) -> None:
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    cases = [
        {"subject": "Hi\r\nBcc: victim@example.com"},
        {"subject": "Hi\nBcc: victim@example.com"},
        {"to": ["lead@example.com\r\nBcc: victim@example.com"]},
        {"from": "a@example.com\nX: y"},
        {"reply_to": "a@example.com\r\n"},
        {"headers": {"X-Campaign": "a\r\nBcc: victim@example.com"}},
        {"headers": {"Bcc": "victim@example.com"}},
        # a store that trusts Content-Length (mbox, some MDAs) would split the message there
        {"headers": {"Content-Length": "5"}},
        {"headers": {"content-LENGTH": "5"}},
        {"headers": {"Bad Name": "x"}},
        {"to": ["not an address"]},
        {"to": []},
        {"cc": ["ok@example.com", "@nohost"]},
    ]
    for i, case in enumerate(cases):
        status, _, body = await gw.email(lease, f"k-inj-{i}", body=case)
        assert status == 400, (case, body)
        assert body["code"] == "bad_request" and body["detail"]
    assert gw.smtp.deliveries == []


async def test_authentication_and_resource_scope(gw: Gw) -> None:
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    h = gw.headers(lease, "k-auth")
    del h["Authorization"]
    status, _, body = await gw.post("/v1/email", h, json={})
    assert (status, body["code"]) == (401, "unauthenticated")
    status, _, body = await gw.email(lease, "k-auth", api_key="wrong-key")
    assert (status, body["code"]) == (401, "unauthenticated")
    assert "wrong-key" not in str(body)
    # the other client may not act on run:* resources
    status, _, body = await gw.email(lease, "k-auth", api_key=OTHER_KEY)
    assert (status, body["code"]) == (403, "forbidden_resource")
    # what to fix: the resource refused, and the patterns this client has
    assert "'run:1'" in body["detail"] and "other:*" in body["detail"], body["detail"]
    assert gw.smtp.deliveries == []


async def test_keys_are_scoped_per_client(gw: Gw) -> None:
    """Two clients choosing the same key are two effects."""
    lease = await gw.leases.claim("run:1", ttl=30)
    other = await gw.leases.claim("other:1", ttl=30)
    assert lease is not None and other is not None
    assert (await gw.email(lease, "shared-key"))[0] == 200
    status, headers, _ = await gw.email(other, "shared-key", api_key=OTHER_KEY)
    assert status == 200 and "Idempotent-Replayed" not in headers
    ids = {d.header("Message-ID") for d in gw.smtp.deliveries}
    assert len(ids) == 2


async def test_missing_and_malformed_effect_headers(gw: Gw) -> None:
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    for name, value in [("Fence-Token", "abc"), ("Fence-Token", "-1"),
                        ("Fence-Token", "99999999999999999999999"), ("Fence-Token", "0"),
                        ("Idempotency-Key", "x" * 256), ("Idempotency-Key", "é"),
                        ("Fence-Resource", "bad resource")]:
        h = gw.headers(lease, "k")
        h[name] = value
        status, _, body = await gw.post("/v1/email", h, json={})
        assert status == 400 and body["code"] == "bad_request", (name, value)
        assert name in body["detail"]
    for name in ("Fence-Resource", "Fence-Token", "Idempotency-Key"):
        h = gw.headers(lease, "k")
        del h[name]
        status, _, body = await gw.post("/v1/email", h, json={})
        assert status == 400 and name in body["detail"]


async def test_oversize_and_malformed_bodies(gw: Gw) -> None:
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    h = gw.headers(lease, "k-big")
    status, _, body = await gw.post("/v1/email", h, json={
        "from": "a@example.com", "to": ["b@example.com"], "subject": "s",
        "text": "x" * 70_000})
    assert (status, body["code"]) == (413, "payload_too_large")
    status, _, body = await gw.post("/v1/email", h, data=b"\xff\xfe not json")
    assert (status, body["code"]) == (400, "bad_request")
    status, _, body = await gw.post("/v1/email", h, json=["a list"])
    assert (status, body["code"]) == (400, "bad_request")
    assert gw.smtp.deliveries == []


async def test_a_callers_content_headers_reach_the_sink(gw: Gw) -> None:
    """A Content-* header the caller sets (Content-Language, Content-ID, ...)
    is sent on the message's top level, for a text email, one with an HTML
    alternative and one with an attachment alike; the email package's
    ``set_content`` clears every Content-* header it finds, and a multipart
    moves them into its first part, so they are set once the body is built."""
    lease = await gw.leases.claim("run:content", ttl=30)
    assert lease is not None
    own = {"Content-Language": "de", "Content-ID": "<c1@example.com>",
           "Content-Description": "Rechnung"}
    bodies = [{"text": "Hallo"}, {"text": "Hallo", "html": "<p>Hallo</p>"},
              {"text": "Hallo", "attachments": [{"filename": "a.txt", "content_type": "text/plain",
                                                  "content": "aGk="}]}]
    for n, extra in enumerate(bodies):
        status, _, body = await gw.email(lease, f"k-content-{n}",
                                         body={"headers": own, **extra})
        assert status == 200, body
        msg = gw.smtp.deliveries[-1]
        for name, value in own.items():
            assert msg.header(name) == value, (extra, name, msg.headers)
        kind = "text/plain" if len(extra) == 1 else "multipart/"
        assert (msg.header("Content-Type") or "").startswith(kind), msg.headers
    assert len(gw.smtp.deliveries) == len(bodies)


async def test_an_attachment_that_is_itself_mime_goes_as_bytes_or_is_refused(gw: Gw) -> None:
    """A message/* or multipart/* part's body is MIME itself, which may not
    be sent in base64 (RFC 2046 5.1, 5.2.1) and which the gateway does not
    take apart. A type guessed from the filename (a forwarded .eml) goes as
    application/octet-stream, its bytes as given; the same type asked for
    is a 400 that says what to send instead, and nothing is sent."""
    import base64
    import email
    import email.policy

    lease = await gw.leases.claim("run:eml", ttl=30)
    assert lease is not None
    eml = b"From: x@example.com\r\nTo: y@example.com\r\nSubject: fwd\r\n\r\nbody\r\n"
    content = base64.b64encode(eml).decode()
    status, _, body = await gw.email(lease, "k-eml", body={
        "attachments": [{"filename": "forwarded.eml", "content": content}]})
    assert status == 200, body
    sent = email.message_from_bytes(gw.smtp.deliveries[-1].body, policy=email.policy.default)
    [part] = list(sent.iter_attachments())  # type: ignore[attr-defined]
    assert part.get_content_type() == "application/octet-stream"
    assert part.get_filename() == "forwarded.eml" and part.get_content() == eml
    before = len(gw.smtp.deliveries)
    for n, kind in enumerate(("message/rfc822", "MESSAGE/global", "multipart/mixed")):
        status, _, body = await gw.email(lease, f"k-eml-{n}", body={"attachments": [
            {"filename": "forwarded.eml", "content": content, "content_type": kind}]})
        assert status == 400 and body["code"] == "bad_request", (kind, body)
        assert "content_type" in body["detail"] and "application/octet-stream" in body["detail"]
    assert len(gw.smtp.deliveries) == before
