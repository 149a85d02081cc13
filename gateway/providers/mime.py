"""An email effect as the headers and the MIME message every transport sends.

SMTP sends the message as built here; HTTP email APIs that take a raw MIME
message (Amazon SES) send it too, and the others carry ``email_headers`` in
their own JSON. Either way an email names its effect: the Message-ID derived
from client and key (the same on every attempt) and the fence it was sent
under (``Fence-Resource``, ``Fence-Token``).
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from email.headerregistry import BaseHeader, HeaderRegistry
from email.message import EmailMessage, Message
from email.parser import BytesParser
from email.policy import SMTP, Policy, compat32
from email.utils import formatdate
from typing import Any

from gateway.api.email_body import addr_spec
from gateway.effects.fingerprint import message_id
from gateway.providers.base import EmailCall
from gateway.wire import FENCE_RESOURCE, FENCE_TOKEN

#: header values this long or shorter are parsed once and the header kept
#: (``_HeaderClasses.__call__``)
PARSED_CHARS = 256
#: the headers kept: those the request checks validated (the addresses, the
#: subject) and the gateway's own, less the Message-ID (new each effect). A
#: caller's own headers are not: their syntax is unchecked, and a parse can
#: hold 2.5 KB per character (``Resent-To: ,é,é,...``)
KEPT_NAMES = frozenset({"from", "to", "cc", "reply-to", "subject", "date", "mime-version",
                        "content-type", "content-transfer-encoding",
                        FENCE_RESOURCE.lower(), FENCE_TOKEN.lower()})
#: the most characters of header values kept at once, least recently used
#: dropped first. The parse of a validated header holds up to about a
#: kilobyte per character (a 254-character To of 32 addresses: 1,705
#: objects, 246 KiB), so this bounds what any caller's headers can make the
#: process hold to about 8 MiB; a sender, a recipient and a subject of 30
#: characters each leave room for 90 emails' worth of distinct ones.
KEPT_CHARS = 8 * 1024


class _FoldedOnce(BaseHeader):
    """A header that folds itself once for the SMTP policy and keeps the
    lines: a kept header (``_HeaderClasses``) is written into message after
    message, and folding was two fifths of writing one. A header's fold is
    a pure function of its name, its parse and the policy."""

    def fold(self, *, policy: Policy) -> str:
        if policy is not SMTP_POLICY:
            return super().fold(policy=policy)
        kept: str | None = self.__dict__.get("_smtp_folded")
        if kept is None:
            kept = self.__dict__["_smtp_folded"] = super().fold(policy=policy)
        return kept


class _HeaderClasses(HeaderRegistry):
    """The standard header classes, each made once: the stdlib's registry
    builds a new class on every lookup, a tenth of the time of building a
    message (bench/NOTES.md). And short headers, each parsed once: a header
    object is immutable (a str, its parse in tuples), so the same From, To
    and Subject of the next email are the same object; the email package's
    parse and refold of each were half the time of building a message."""

    @functools.lru_cache(maxsize=512)  # noqa: B019 (one instance, as long as the process)
    def __getitem__(self, name: str) -> type[BaseHeader]:
        return super().__getitem__(name)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._kept: OrderedDict[tuple[str, str], BaseHeader] = OrderedDict()
        self.kept_chars = 0

    def __call__(self, name: str, value: str) -> BaseHeader:
        if len(value) > PARSED_CHARS or name.lower() not in KEPT_NAMES:
            return super().__call__(name, value)
        key = (name, str(value))
        header = self._kept.get(key)
        if header is not None:
            self._kept.move_to_end(key)
            return header
        header = super().__call__(name, value)  # one that raises is not kept
        self._kept[key] = header
        self.kept_chars += len(name) + len(key[1])
        while self.kept_chars > KEPT_CHARS:
            (old_name, old_value), _ = self._kept.popitem(last=False)
            self.kept_chars -= len(old_name) + len(old_value)
        return header

    def forget(self) -> None:
        """Drop every kept header (tests measure from empty)."""
        self._kept.clear()
        self.kept_chars = 0


#: email.policy.SMTP (CRLF line ends, RFC 2047 where needed), its header classes cached
SMTP_POLICY = SMTP.clone(header_factory=_HeaderClasses(base_class=_FoldedOnce))


def email_headers(call: EmailCall) -> dict[str, str]:
    """The headers the gateway adds to every email, then the caller's own
    (requests.py refused those that would override the gateway's)."""
    return {"Message-ID": message_id(call.client, call.key), FENCE_RESOURCE: call.resource,
            FENCE_TOKEN: str(call.fence), **call.email.headers}


class Unbuildable(ValueError):
    """The email cannot be built, or its built form would not be the message
    meant: a 400 before admission (effects.py builds it there first)."""


def _header_names(msg: Message) -> list[list[str]]:
    """Every part's header names, in order, part by part."""
    return [[name.lower() for name in part.keys()] for part in msg.walk()]


def _verified(msg: EmailMessage, addresses: dict[str, list[str]]) -> bytes:
    """The message's bytes, once read back they hold exactly the headers set,
    part by part, and no header line holds a stray CR or LF: whatever the
    interpreter's email package did with encoded words (CVE-2024-6923) or
    with characters it breaks lines at, an extra header line, or a header
    section ended early, is caught here rather than sent."""
    data = msg.as_bytes(policy=SMTP_POLICY)
    head = data.split(b"\r\n\r\n", 1)[0]
    if any(b"\r" in line or b"\n" in line for line in head.split(b"\r\n")):
        raise Unbuildable("a header would carry a bare line break")
    back = BytesParser(policy=compat32).parsebytes(data)
    if _header_names(back) != _header_names(msg):
        raise Unbuildable("its headers would not be the ones set (a value holds a line "
                          "break, or an encoded word that decodes to one)")
    _same_addresses(back, addresses)
    return data


def _read_back(back: Message, name: str) -> list[Any]:
    """Every ``name`` header of the message read back, as the SMTP policy
    parses it: what ``BytesParser(policy=SMTP_POLICY)`` would give, without
    a second parse of the bytes (both policies split header lines alike;
    the SMTP policy parses a value when it is fetched)."""
    return [SMTP_POLICY.header_fetch_parse(k, v) for k, v in back.raw_items()
            if k.lower() == name.lower()]


def _same_addresses(back: Message, addresses: dict[str, list[str]]) -> None:
    """Every address header, read back as receivers read it (encoded words
    decoded), names exactly the addr-specs validated, one per address given:
    a display name the email package decoded into another address, a list
    or a group is caught here, whatever this interpreter does with it."""
    for name, want in addresses.items():
        got = [a.addr_spec for h in _read_back(back, name) for a in h.addresses]
        if got != [addr_spec(v) for v in want]:
            raise Unbuildable(f"its {name} header would not read back as the addresses "
                              "given (a display name that decodes to another address, a "
                              "list or a group, or an address the email package reads "
                              "otherwise)")


def build_message(call: EmailCall, idempotency_header: str) -> bytes:
    """The whole message: headers, text and/or HTML, then the attachments.
    Bcc is left out: those recipients are only in the envelope. Raises
    Unbuildable when the email package refuses it, or when the bytes it
    made would not read back as the headers set (``_verified``)."""
    try:
        req = call.email
        addresses = {"From": [req.sender], "To": req.to, "Cc": req.cc,
                     "Reply-To": [req.reply_to] if req.reply_to else []}
        return _verified(_message(call, idempotency_header), addresses)
    except Unbuildable:
        raise
    except Exception as e:
        # The email package's own bugs raise what they raise: 3.11's header
        # parser an AttributeError for a display name that starts with a dot
        # (". <a@b>"), others IndexError, ValueError, MessageError. The
        # message is the caller's input, built here and nowhere else.
        raise Unbuildable(f"the email package cannot build it ({type(e).__name__})") from None


def _message(call: EmailCall, idempotency_header: str) -> EmailMessage:
    req = call.email
    msg = EmailMessage(policy=SMTP_POLICY)
    msg["From"] = req.sender
    msg["To"] = ", ".join(req.to)
    if req.cc:
        msg["Cc"] = ", ".join(req.cc)
    if req.reply_to:
        msg["Reply-To"] = req.reply_to
    msg["Subject"] = req.subject
    msg["Date"] = formatdate(usegmt=True)
    extra = email_headers(call)
    msg["Message-ID"] = extra.pop("Message-ID")
    msg[FENCE_RESOURCE] = extra.pop(FENCE_RESOURCE)
    msg[FENCE_TOKEN] = extra.pop(FENCE_TOKEN)
    if idempotency_header:
        msg[idempotency_header] = call.derived_key
    # a Content-* header goes on once the body is built: set_content clears
    # them, and making a multipart moves them into its first part
    content = {n: v for n, v in extra.items() if n.lower().startswith("content-")}
    for name, value in extra.items():
        if name not in content:
            msg[name] = value
    if req.text is not None:
        msg.set_content(req.text)
        if req.html is not None:
            msg.add_alternative(req.html, subtype="html")
    else:
        msg.set_content(req.html or "", subtype="html")
    for a in req.attachments:
        maintype, _, subtype = a.content_type.partition("/")
        msg.add_attachment(a.content, maintype=maintype, subtype=subtype, filename=a.filename)
    for name, value in content.items():
        msg[name] = value
    return msg
