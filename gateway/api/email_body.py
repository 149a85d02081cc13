"""Pure checks of the body of ``POST /v1/email``: the addresses, the text
that goes into headers (no line breaks, no encoded word that decodes to
one), the caller's own headers and attachments, into an ``EmailRequest``.

The SMTP envelope and every email API's address fields are made from the
parts these checks validated (``mailbox``, ``addr_spec``). Every failure is
a ``Problem("bad_request")`` whose detail names the field (``parsing.bad``).
"""

from __future__ import annotations

import base64
import binascii
import encodings
import mimetypes
import pkgutil
import re
from dataclasses import dataclass
from encodings.aliases import aliases
from typing import Any

from gateway.api.parsing import bad
from gateway.wire import FENCE_RESOURCE, FENCE_TOKEN

_ADDR = re.compile(r"[^\s@<>()\[\],;:\"\\]{1,64}@[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252})")
#: "addr" or "Display Name <addr>"; the name without quotes, brackets or backslashes
_MAILBOX = re.compile(r'(?:[^<>"\\]*?\s*<(?P<addr>[^<>\s]+)>|(?P<bare>[^<>\s]+))')
#: what makes a display name read as more than a name: another address, a
#: list, a group, a comment
_NAME_SPECIALS = "@,;:()[]"
_HEADER_NAME = re.compile(r"[A-Za-z0-9-]{1,64}")
MAX_RECIPIENTS = 100
MAX_SUBJECT = 998
#: the longest value of one of the caller's own headers (a folded field may
#: be longer than a line's 998 characters: a References of 100 ids), and
#: how many of them
MAX_HEADER_VALUE = 4096
MAX_EXTRA_HEADERS = 50
#: encoded words (RFC 2047) in one header's value: the email package's parse
#: of a header grows with the square of their number (20,000 of them, 320
#: KB, took 5.5 s and 3.1 GB; a From of 8,000, 3 s and 953 MB)
MAX_ENCODED_WORDS = 64
MAX_ATTACHMENTS = 50
MAX_FILENAME = 255
#: type/subtype as RFC 6838 names them, without parameters
_MEDIA_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}/"
                         r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}")

OCTETS = "application/octet-stream"
#: attachments' media types whose body is MIME itself (a forwarded message,
#: a multipart): such a part may not be base64 (RFC 2046 5.1, 5.2.1), and its
#: bytes would have to be taken apart and rebuilt to be sent otherwise
MIME_ITSELF = ("message/", "multipart/")

#: headers an email's "headers" field may not set, in any letter case: the
#: gateway owns them (the fence headers too: receivers check them), and
#: Content-Length, which a store that trusts it (mbox, some MDAs) would split
#: the message at. The provider's idempotency header is refused by
#: ``owned_header``.
RESERVED_EMAIL_HEADERS = frozenset({
    "from", "to", "cc", "bcc", "reply-to", "subject", "message-id", "date", "sender",
    "mime-version", "content-type", "content-transfer-encoding", "content-disposition",
    "content-length",
    "return-path", "received",
    FENCE_RESOURCE.lower(), FENCE_TOKEN.lower(),
})


#: what the email package breaks a header line at, or what no header may
#: carry: C0 controls but tab, DEL, C1 controls (\x85 among them), and the
#: Unicode line and paragraph separators
_NOT_IN_HEADERS = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")
#: an RFC 2047 encoded word: =?charset?Q|B?text?=. The charset and the text
#: may hold whitespace: the email package decodes such a word too (with a
#: defect), looking its charset up
_ENCODED_WORD = re.compile(r"=\?([^?]*)\?([QqBb])\?([^?]*?)\?=")
#: a charset's name as the gateway looks it up: ASCII, no whitespace
_CHARSET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:+-]{0,63}")
#: charsets mail uses under names Python has no alias for, and the codec
#: the check decodes them with (a fixed set: the email package looks each
#: up, and the codec registry keeps the miss, so it stays bounded)
_MAIL_CHARSETS = {
    "windows-874": "cp874", "iso-8859-8-i": "iso8859_8", "iso-8859-8-e": "iso8859_8",
    "iso-8859-6-i": "iso8859_6", "iso-8859-6-e": "iso8859_6", "windows-31j": "cp932",
    "x-sjis": "shift_jis", "x-euc-jp": "euc_jp", "x-mac-roman": "mac_roman",
    "x-big5": "big5", "x-cp1252": "cp1252", "unknown-8bit": "ascii",
}


def _word_bytes(encoding: str, text: str) -> bytes | None:
    """The bytes one encoded word stands for (None: not decodable, and the
    email package writes it out as it is)."""
    try:
        if encoding in "Qq":
            return binascii.a2b_qp(text.encode("ascii"), header=True)
        return base64.b64decode(text + "=" * (-len(text) % 4))
    except (ValueError, binascii.Error):
        return None


def _codec(charset: str) -> str | None:
    """The codec module an encoded word's charset names (``utf_8`` for
    "UTF-8"), found as the codec registry's own search finds it but without
    asking the registry: it keeps every name it is asked for and lacks
    (``encodings._cache``), so made-up charsets, a new one per word, grew
    the process without bound. None: Python has no codec by that name."""
    name = (charset.partition("*")[0] or "ascii").lower()
    if not _CHARSET_NAME.fullmatch(name):
        return None  # CPython's own lookup reads such a name otherwise
    if name in _MAIL_CHARSETS:
        return _MAIL_CHARSETS[name]
    norm = encodings.normalize_encoding(name)
    for module in (aliases.get(norm) or aliases.get(norm.replace(".", "_")), norm):
        if module and "." not in module and module in _CODEC_MODULES:
            return module
    return None


#: the codec modules of the standard library (encodings/), the names its search imports
_CODEC_MODULES = frozenset(m.name for m in pkgutil.iter_modules(encodings.__path__))


def _word_text(codec: str | None, data: bytes) -> str | None:
    """The text one encoded word's bytes stand for in its charset's codec
    (``_codec``); None when there is none, or it decodes no text."""
    if codec is None:
        return None
    try:
        return data.decode(codec, errors="replace")
    except (LookupError, UnicodeError):  # "base64" is no text codec, "undefined" refuses
        return None


def _word_problem(charset: str, encoding: str, text: str) -> str | None:
    """What is wrong with one encoded word, if anything: a charset no codec
    decodes (the email package, a receiver, would each guess), or a control
    character or a line break, in its bytes (whatever the charset) or in
    its text."""
    unknown = "must not contain an encoded word (RFC 2047) in a charset the gateway " \
              "cannot decode"
    codec = _codec(charset)
    if codec is None:
        return unknown
    data = _word_bytes(encoding, text)
    if data is None:
        return None  # not decodable: the email package writes it out as it is
    decoded = _word_text(codec, data)
    if decoded is None:
        return unknown
    if any((b < 0x20 and b != 0x09) or b == 0x7F for b in data) or \
            _NOT_IN_HEADERS.search(decoded):
        return "must not contain an encoded word (RFC 2047) that decodes to line breaks " \
               "or control characters"
    return None


def decoded_words(value: str) -> str:
    """``value`` with every RFC 2047 encoded word replaced by the text it
    stands for: what the email package, a receiver, or an email API reads
    out of a display name or a filename."""
    def one(m: re.Match[str]) -> str:
        charset, encoding, text = m.groups()
        data = _word_bytes(encoding, text)
        decoded = None if data is None else _word_text(_codec(charset), data)
        return m.group(0) if decoded is None else decoded
    return _ENCODED_WORD.sub(one, value)


def header_text(field: str, value: str) -> str:
    """Text that goes into an email header (a subject, a header value, a
    display name, a filename): refused if it holds a character the email
    package breaks lines at, or an RFC 2047 encoded word that decodes to one
    (CVE-2024-6923: an unpatched email package writes it out raw). Whether
    this interpreter is patched does not matter: both are refused."""
    if _NOT_IN_HEADERS.search(value):
        raise bad(field, "must not contain line breaks or control characters")
    for n, m in enumerate(_ENCODED_WORD.finditer(value)):
        if n == MAX_ENCODED_WORDS:
            raise bad(field, f"must hold at most {MAX_ENCODED_WORDS} encoded words (RFC 2047)")
        problem = _word_problem(*m.groups())
        if problem:
            raise bad(field, problem)
    return value


def mailbox(value: str) -> tuple[str, str]:
    """``(display name, addr-spec)`` of an address ``address`` accepted: the
    parts it validated, exactly. The SMTP envelope and every API's address
    fields are made from these, never from a second parser's reading."""
    m = _MAILBOX.fullmatch(value.strip())
    assert m is not None, "address() accepted it"
    if m.group("bare"):
        return "", m.group("bare")
    return value.strip()[: m.start("addr") - 1].strip(), m.group("addr")


def addr_spec(value: str) -> str:
    """The addr-spec of an address ``address`` accepted."""
    return mailbox(value)[1]


def address(field: str, value: Any) -> str:
    """One address, bare or ``Name <addr>``, returned as given. A display name
    holding an address-like token (``@``, or a comma, semicolon, colon,
    parenthesis or bracket that make a list, a group or a comment of it) is
    refused: a receiver, or a parser other than ours, would read another
    address out of it."""
    if not isinstance(value, str) or not value:
        raise bad(field, "must be an email address")
    header_text(field, value)
    m = _MAILBOX.fullmatch(value.strip())
    addr = m and (m.group("addr") or m.group("bare"))
    if not addr or not _ADDR.fullmatch(addr) or ".." in addr.split("@")[1] or \
            addr.endswith("."):
        raise bad(field, f"{value[:200]!r} is not a valid email address")
    if not addr.isascii():  # the SMTP envelope is ASCII: no SMTPUTF8 (RFC 6531)
        raise bad(field, "the address (not its display name) must be ASCII: "
                  "internationalized addresses are not supported")
    name = mailbox(value)[0]
    if any(ch in name for ch in _NAME_SPECIALS):
        raise bad(field, "the display name must not contain any of " + _NAME_SPECIALS)
    # an encoded word is decoded by the email package and by every reader:
    # what it stands for is the name, held to the same rule (and no quotes,
    # brackets or backslashes, which a plain name cannot hold either)
    if any(ch in decoded_words(name) for ch in _NAME_SPECIALS + '<>"\\'):
        raise bad(field, "the display name must not contain an encoded word (RFC 2047) "
                  "that decodes to any of " + _NAME_SPECIALS + '<>"\\')
    return value


def address_list(field: str, value: Any, required: bool) -> list[str]:
    if value is None and not required:
        return []
    if not isinstance(value, list) or (required and not value):
        raise bad(field, "must be a non-empty list of addresses" if required
                  else "must be a list of addresses")
    if len(value) > MAX_RECIPIENTS:
        raise bad(field, f"at most {MAX_RECIPIENTS} addresses")
    return [address(f"{field}[{i}]", v) for i, v in enumerate(value)]


@dataclass(frozen=True)
class Attachment:
    """One attached file: its name, its media type, and its bytes."""

    filename: str
    content_type: str
    content: bytes

    @property
    def base64(self) -> str:
        return base64.b64encode(self.content).decode("ascii")


@dataclass(frozen=True)
class EmailRequest:
    provider: str | None
    sender: str
    to: list[str]
    cc: list[str]
    bcc: list[str]
    reply_to: str | None
    subject: str
    text: str | None
    html: str | None
    headers: dict[str, str]
    attachments: tuple[Attachment, ...] = ()

    @property
    def recipients(self) -> list[str]:
        """The envelope's recipients (RCPT TO): the validated addr-specs."""
        return [addr_spec(a) for a in (*self.to, *self.cc, *self.bcc)]

    @property
    def envelope_sender(self) -> str:
        """The envelope's sender (MAIL FROM): the validated addr-spec."""
        return addr_spec(self.sender)


def extra_headers(extra: Any) -> dict[str, str]:
    """The caller's own email headers: valid names, no CR/LF, none the gateway sets."""
    if not isinstance(extra, dict):
        raise bad("headers", "must be an object of header names to values")
    if len(extra) > MAX_EXTRA_HEADERS:
        raise bad("headers", f"at most {MAX_EXTRA_HEADERS} headers")
    for name, value in extra.items():
        if not _HEADER_NAME.fullmatch(name):
            raise bad("headers", f"{name[:64]!r} is not a valid header name")
        if name.lower() in RESERVED_EMAIL_HEADERS:
            raise bad(f"headers.{name}", "is set by the gateway")
        if not isinstance(value, str):
            raise bad(f"headers.{name}", "must be a string")
        if len(value) > MAX_HEADER_VALUE:
            raise bad(f"headers.{name}", f"at most {MAX_HEADER_VALUE} characters")
        header_text(f"headers.{name}", value)
    return dict(extra)


def owned_header(email: EmailRequest, name: str) -> None:
    """Refuse an email whose own headers name ``name`` (in any letter case):
    a header the provider's configuration has the gateway set (its
    idempotency header)."""
    for header in email.headers:
        if name and header.lower() == name.lower():
            raise bad(f"headers.{header}", "is set by the gateway")


def attachment(field: str, value: Any) -> Attachment:
    """One entry of ``attachments``: ``{"filename", "content" (base64),
    "content_type"?}``. The whole body is already within ``max_body_bytes``."""
    if not isinstance(value, dict):
        raise bad(field, "must be an object with filename and content")
    for key in value:
        if key not in ("filename", "content", "content_type"):
            raise bad(f"{field}.{str(key)[:64]}", "is not a known field")
    filename = value.get("filename")
    if not isinstance(filename, str) or not 0 < len(filename) <= MAX_FILENAME:
        raise bad(f"{field}.filename", f"must be 1 to {MAX_FILENAME} characters")
    header_text(f"{field}.filename", filename)
    if any(ch in filename or ch in decoded_words(filename) for ch in '/\\"'):
        raise bad(f"{field}.filename", "must not contain quotes or path separators, "
                  "nor an encoded word (RFC 2047) that decodes to one")
    content = value.get("content")
    if not isinstance(content, str):
        raise bad(f"{field}.content", "is required: the file's bytes in base64")
    try:
        data = base64.b64decode(content, validate=True)
    except (binascii.Error, ValueError):
        raise bad(f"{field}.content", "must be base64 (RFC 4648, no line breaks)") from None
    content_type = value.get("content_type")
    if content_type is None:
        content_type = mimetypes.guess_type(filename)[0] or OCTETS
        if content_type.startswith(MIME_ITSELF):  # a forwarded .eml: its bytes as given
            content_type = OCTETS
    elif not isinstance(content_type, str) or not _MEDIA_TYPE.fullmatch(content_type):
        raise bad(f"{field}.content_type", "must be a media type such as application/pdf")
    elif content_type.lower().startswith(MIME_ITSELF):
        raise bad(f"{field}.content_type", f"cannot be {content_type}: a part of that type is "
                  "MIME itself, which may not be sent in base64 (RFC 2046) and which the "
                  f"gateway does not take apart; send the file as {OCTETS}, its bytes as "
                  "they are")
    return Attachment(filename, content_type.lower(), data)


def attachment_list(value: Any) -> tuple[Attachment, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise bad("attachments", "must be a list of attachments")
    if len(value) > MAX_ATTACHMENTS:
        raise bad("attachments", f"at most {MAX_ATTACHMENTS} attachments")
    return tuple(attachment(f"attachments[{i}]", v) for i, v in enumerate(value))


_EMAIL_FIELDS = {"provider", "from", "to", "cc", "bcc", "reply_to", "subject", "text", "html",
                 "headers", "attachments"}


def email_request(body: Any) -> EmailRequest:
    """Check the body of ``POST /v1/email``."""
    if not isinstance(body, dict):
        raise bad("body", "must be a JSON object")
    for key in body:
        if key not in _EMAIL_FIELDS:
            raise bad(str(key)[:64], "is not a known field")
    provider = body.get("provider")
    if provider is not None and not isinstance(provider, str):
        raise bad("provider", "must be a string")
    subject = body.get("subject")
    if not isinstance(subject, str):
        raise bad("subject", "is required and must be a string")
    if len(subject) > MAX_SUBJECT:
        raise bad("subject", f"at most {MAX_SUBJECT} characters")
    header_text("subject", subject)
    text, html = body.get("text"), body.get("html")
    for name, part in (("text", text), ("html", html)):
        if part is not None and not isinstance(part, str):
            raise bad(name, "must be a string")
    if text is None and html is None:
        raise bad("text", "text or html is required")
    extra = extra_headers(body.get("headers") or {})
    reply_to = body.get("reply_to")
    to = address_list("to", body.get("to"), required=True)
    cc = address_list("cc", body.get("cc"), required=False)
    for field, addresses in (("to", to), ("cc", cc)):
        # the header as the message holds it: an encoded word split over two
        # addresses ("=?x?q?a <a@b.c>", "?= <d@e.f>") is one once joined
        header_text(field, ", ".join(addresses))
    return EmailRequest(
        provider=provider,
        sender=address("from", body.get("from")),
        to=to,
        cc=cc,
        bcc=address_list("bcc", body.get("bcc"), required=False),
        reply_to=None if reply_to is None else address("reply_to", reply_to),
        subject=subject,
        text=text,
        html=html,
        headers=extra,
        attachments=attachment_list(body.get("attachments")),
    )
