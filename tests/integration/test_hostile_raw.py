"""Hostile input, by hand, on the raw socket: what a well-behaved HTTP client
would never send."""

from __future__ import annotations

import logging

import pytest

from tests.integration.conftest import API_KEY, Gw
from tests.support.rawhttp import raw


def request(headers: list[tuple[bytes, bytes]], body: bytes = b"{}",
            path: bytes = b"/v1/email") -> bytes:
    lines = [b"POST " + path + b" HTTP/1.1", b"Host: x", b"Connection: close",
             b"Content-Type: application/json",
             b"Content-Length: " + str(len(body)).encode()]
    lines += [k + b": " + v for k, v in headers]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


@pytest.mark.parametrize("name", [b"Fence-Resource", b"Fence-Token", b"Idempotency-Key",
                                  b"Authorization"])
@pytest.mark.parametrize("bad", [b"a\rb", b"a\nInjected: 1", b"a\x00b"])
async def test_cr_lf_or_nul_in_any_header_is_refused(gw: Gw, name: bytes, bad: bytes) -> None:
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    headers = {b"Authorization": b"Bearer " + API_KEY.encode(),
               b"Fence-Resource": b"run:1", b"Fence-Token": str(lease.fence).encode(),
               b"Idempotency-Key": b"raw-1"}
    headers[name] = headers[name][:4] + bad
    body = (b'{"from": "a@example.com", "to": ["b@example.com"], "subject": "s", '
            b'"text": "t"}')
    status, _ = await raw(gw, request(list(headers.items()), body))
    assert 400 <= status < 500 or status == 0  # refused by the parser or by the gateway
    assert gw.smtp.deliveries == []


async def test_an_absolute_url_in_the_request_line_reaches_no_other_host(gw: Gw) -> None:
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    headers = [(b"Authorization", b"Bearer " + API_KEY.encode()),
               (b"Fence-Resource", b"run:1"), (b"Fence-Token", str(lease.fence).encode()),
               (b"Idempotency-Key", b"abs-1")]
    status, _ = await raw(gw, request(headers, path=b"http://evil.example/v1/http/crm/x"))
    # aiohttp routes on the path; the gateway only ever calls crm's base URL
    for d in gw.hook.deliveries:
        assert d.path.startswith("/api/")
    assert status != 0


async def test_non_utf8_and_non_json_bodies_on_every_json_route(gw: Gw) -> None:
    auth = {"Authorization": f"Bearer {API_KEY}"}
    for path in ("/v1/leases/claim", "/v1/leases/renew", "/v1/leases/release",
                 "/v1/effects/k/resolve"):
        for body in (b"\xff\xfe\xfd", b"not json", b"[1, 2", b"null", b'"str"', b"1e999"):
            status, _, doc = await gw.post(path, auth, data=body)
            assert status == 400 and doc["code"] == "bad_request", (path, body, doc)


#: JSON escapes of UTF-16 surrogates with no partner: valid JSON syntax,
#: but no Unicode text, so no UTF-8 (the database's, a provider's) holds it
LONE_SURROGATES = [b'"\\ud800"', b'"a\\udfffb"', b'"\\ude00\\ud83d"',
                   # and unescaped, in CESU-8 (a surrogate's code point as UTF-8
                   # bytes): json.loads decodes bytes with "surrogatepass", so
                   # these parsed too, and no escape was there to be found
                   b'"\xed\xa0\x80"', b'"a\xed\xbf\xbfb"']


@pytest.mark.parametrize("value", LONE_SURROGATES)
@pytest.mark.parametrize("path,template", [
    ("/v1/leases/claim", b'{"resource": "run:2", "ttl_seconds": 5, "owner": %s}'),
    ("/v1/leases/renew", b'{"resource": "run:1", "ttl_seconds": 5, "fence": 1, "owner": %s}'),
    ("/v1/leases/release", b'{"resource": "run:1", "fence": 1, "owner": %s}'),
    ("/v1/email", b'{"from": "agent@example.com", "to": ["lead@example.com"], '
                  b'"subject": %s, "text": "t"}'),
])
async def test_a_lone_surrogate_in_a_json_body_is_a_bad_request(
        gw: Gw, caplog: pytest.LogCaptureFixture, path: str, template: bytes,
        value: bytes) -> None:
    """``"\\ud800"`` parses, as a str no encoder takes: the database driver
    refused the owner (asyncpg DataError) and the caller got 500 with a
    traceback. A body that holds one is refused 400 where it is parsed."""
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    with caplog.at_level(logging.INFO):
        status, _, doc = await gw.post(path, {**gw.headers(lease, "k-lone"),
                                              "Content-Type": "application/json"},
                                       data=template % value)
    assert status == 400 and doc["code"] == "bad_request", doc
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert gw.smtp.deliveries == [] and await gw.effect_state("k-lone") is None


@pytest.mark.parametrize("name", [b"\\ud800", b"\xed\xa0\x80", b"a\xed\xbf\xbfb"])
async def test_a_lone_surrogate_in_a_bcc_name_is_a_bad_request(
        gw: Gw, caplog: pytest.LogCaptureFixture, name: bytes) -> None:
    """A Bcc display name goes into no header, so no message build trips on
    it; it reached the request's summary, which the admission could not
    store (asyncpg DataError): a 500, and the recipients in the error log.
    Unescaped (CESU-8 bytes) it even passed the escape check, as json.loads
    decodes bytes with "surrogatepass". Refused 400 where it is parsed."""
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    body = (b'{"from": "agent@example.com", "to": ["lead@example.com"], '
            b'"bcc": ["Audit ' + name + b' <audit@example.com>"], "subject": "s", '
            b'"text": "t"}')
    with caplog.at_level(logging.INFO):
        status, _, doc = await gw.post("/v1/email", {**gw.headers(lease, "k-bcc"),
                                                     "Content-Type": "application/json"},
                                       data=body)
    assert status == 400 and doc["code"] == "bad_request", doc
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert gw.smtp.deliveries == [] and await gw.effect_state("k-bcc") is None


@pytest.mark.parametrize("value", LONE_SURROGATES)
async def test_a_lone_surrogate_in_a_proxied_json_body_is_not_a_500(
        gw: Gw, caplog: pytest.LogCaptureFixture, value: bytes) -> None:
    """A proxied body goes to the provider as it came; it is fingerprinted
    canonically when it is JSON. Re-encoding one with a lone surrogate raised
    UnicodeEncodeError (500, a traceback): such a body is fingerprinted as
    sent, like a body that is not JSON, and forwarded unchanged."""
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    data = b'{"name": %s}' % value
    with caplog.at_level(logging.INFO):
        status, _, doc = await gw.post("/v1/http/hook/contacts", {
            **gw.headers(lease, "k-lone"), "Content-Type": "application/json"}, data=data)
    assert status == 200, doc
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    [d] = gw.hook.deliveries
    assert d.body == data
    again, headers, _ = await gw.post("/v1/http/hook/contacts", {
        **gw.headers(lease, "k-lone"), "Content-Type": "application/json"}, data=data)
    assert again == 200 and headers.get("Idempotent-Replayed") == "true"
    assert len(gw.hook.deliveries) == 1


@pytest.mark.parametrize("key", [b"\xff\xfe", API_KEY.encode() + b"\xe9", b"caf\xc3"])
async def test_a_key_that_is_not_utf8_is_unauthenticated(
        gw: Gw, caplog: pytest.LogCaptureFixture, key: bytes) -> None:
    """aiohttp reads header bytes that are not UTF-8 as lone surrogates
    (surrogateescape); hashing such a key raised UnicodeEncodeError, a 500
    with a traceback for anyone, no key needed. It is an unknown key: 401."""
    with caplog.at_level(logging.INFO):
        status, data = await raw(gw, request([(b"Authorization", b"Bearer " + key)],
                                             b'{"resource": "run:5", "ttl_seconds": 5}',
                                             path=b"/v1/leases/claim"))
    assert status == 401 and b'"unauthenticated"' in data, data
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


@pytest.mark.parametrize("cookie", [b"fencegate_console=a.\xff", b"fencegate_console=\xe9.b"])
async def test_a_console_cookie_that_is_not_utf8_is_no_session(
        gw: Gw, caplog: pytest.LogCaptureFixture, cookie: bytes) -> None:
    """The same for the console's session cookie: no session, so the login
    page, never a 500."""
    with caplog.at_level(logging.INFO):
        status, data = await raw(gw, b"GET /console/leases HTTP/1.1\r\nHost: x\r\n"
                                     b"Connection: close\r\nCookie: " + cookie + b"\r\n\r\n")
    assert status == 303 and b"Location: /console/login" in data, data
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


@pytest.mark.parametrize("key", ["%00", "a%00b", "%01", "%7F"])
@pytest.mark.parametrize("method,suffix", [("GET", ""), ("POST", "/resolve")])
async def test_an_effect_key_no_effect_can_have_is_not_found(
        gw: Gw, caplog: pytest.LogCaptureFixture, key: str, method: str, suffix: str) -> None:
    """``/v1/effects/{key}`` takes the key from the path, decoded: a NUL
    reached PostgreSQL, which cannot hold one in text (500, a traceback). A
    key an ``Idempotency-Key`` could never be (1 to 255 printable ASCII) names
    no effect: 404 not_found, nothing asked of the database."""
    auth = {"Authorization": f"Bearer {API_KEY}"}
    with caplog.at_level(logging.INFO):
        status, _, doc = await gw.request(method, f"/v1/effects/{key}{suffix}", auth,
                                          **({"json": {"outcome": "sent"}} if suffix else {}))
    assert status == 404 and doc["code"] == "not_found", doc
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


@pytest.mark.parametrize("value", [b"10\xff00", b"caf\xe9", b"\xc3"])
async def test_a_header_that_is_not_utf8_is_not_forwarded_altered(
        gw: Gw, value: bytes) -> None:
    """aiohttp reads header bytes that are not UTF-8 as lone surrogates; its
    C writer then drops them ("X-Amount: 10\\xff00" reached the provider as
    "X-Amount: 1000"), and its pure-Python writer raises UnicodeEncodeError
    after the admission (500, the key left in flight). Such a header cannot
    be forwarded as sent: 400 before admission, nothing reserved or sent."""
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    status, data = await raw(gw, request([
        (b"Authorization", b"Bearer " + API_KEY.encode()), (b"Fence-Resource", b"run:1"),
        (b"Fence-Token", str(lease.fence).encode()), (b"Idempotency-Key", b"k-hdr"),
        (b"X-Amount", value)], b'{"a": 1}', path=b"/v1/http/hook/pay"))
    assert status == 400 and b'"bad_request"' in data and b"X-Amount" in data, data
    assert gw.hook.deliveries == []
    assert await gw.effect_state("k-hdr") is None


async def test_every_line_of_a_repeated_header_counts(gw: Gw) -> None:
    """A header the caller names on a second Connection line is hop by hop
    too, and a repeated field reaches the provider whole, as one field of
    its values joined (RFC 9110 5.3): the gateway read one line of each, so
    ``Connection: close`` then ``Connection: X-Hop`` forwarded X-Hop, and
    ``X-A: a`` then ``x-a: b`` sent only ``a``."""
    lease = await gw.leases.claim("lead:7", ttl=30)
    assert lease is not None
    headers = [(b"Authorization", b"Bearer " + API_KEY.encode()),
               (b"Fence-Resource", b"lead:7"), (b"Fence-Token", str(lease.fence).encode()),
               (b"Idempotency-Key", b"dup-1"), (b"Connection", b"X-Hop"),
               (b"X-Hop", b"secret-hop"), (b"X-A", b"a"), (b"x-a", b"b")]
    status, _ = await raw(gw, request(headers, path=b"/v1/http/crm/contacts/7"))
    assert status == 200
    [d] = gw.hook.deliveries
    assert d.header("X-Hop") is None
    assert d.header("X-A") == "a, b"


async def test_a_repeated_header_too_long_once_joined_is_refused_before_admission(
        gw: Gw) -> None:
    """Two lines of 5,000 bytes each pass the gateway's server; joined, the
    field is longer than a server with the same defaults reads: a 400
    before the admission, nothing sent, and the key still free."""
    lease = await gw.leases.claim("lead:7", ttl=30)
    assert lease is not None
    auth = [(b"Authorization", b"Bearer " + API_KEY.encode()),
            (b"Fence-Resource", b"lead:7"), (b"Fence-Token", str(lease.fence).encode()),
            (b"Idempotency-Key", b"long-1")]
    trace = [(b"X-Trace", b"t" * 5000), (b"X-Trace", b"u" * 5000)]
    status, _ = await raw(gw, request(auth + trace, path=b"/v1/http/crm/contacts/7"))
    assert status == 400 and gw.hook.deliveries == []
    status, _ = await raw(gw, request(auth + trace[:1], path=b"/v1/http/crm/contacts/7"))
    assert status == 200 and len(gw.hook.deliveries) == 1
