"""The charset an encoded word (RFC 2047) names, in a caller's subject,
display name, header or filename: decoded with the codec Python has by
that name, or refused, and never a cost that outlives the request."""

from __future__ import annotations

import encodings

import pytest

from gateway.api import email_body
from gateway.api.problems import Problem
from gateway.providers import mime
from gateway.providers.base import EmailCall


def _body(word: str) -> dict[str, object]:
    return {"from": f"{word} <agent@example.com>", "to": ["a@example.com"],
            "subject": word, "text": "t", "headers": {"X-Note": word},
            "attachments": [{"filename": f"{word}.txt", "content": "aGk="}]}


@pytest.mark.parametrize("charset", ["utf-8", "UTF-8", "iso-8859-1", "windows-1252",
                                     "us-ascii", "shift_jis", "iso-2022-jp", "koi8-r",
                                     "utf-8*en", "windows-874", "ISO-8859-8-I", "x-sjis",
                                     "unknown-8bit"])
def test_a_word_in_a_charset_python_has_is_taken(charset: str) -> None:
    req = email_body.email_request(_body(f"=?{charset}?q?abc?="))
    mime.build_message(EmailCall("agents", "k", "run:1", 1, email=req), "")


@pytest.mark.parametrize("charset", ["x-made-up", "undefined", "base64", "rot13", "mbcs",
                                     "aliases", "utf.8", "utf 8", "utf\t8", "utf\u00a08",
                                     "ut\u00e9f-8"])
def test_a_word_in_a_charset_no_codec_decodes_is_a_bad_request(charset: str) -> None:
    """"undefined" raised a UnicodeError out of the check (a 500); the
    others were guessed as ASCII, as the email package guesses."""
    with pytest.raises(Problem) as refused:
        email_body.email_request(_body(f"=?{charset}?q?abc?="))
    assert refused.value.code == "bad_request"
    assert "charset" in refused.value.detail


def test_made_up_charsets_leave_nothing_behind() -> None:
    """The codec registry keeps every name it is asked for and lacks
    (``encodings._cache``, for good): a caller naming a new charset in each
    encoded word, 1,000 words a request, grew the gateway by about a
    megabyte a request, refused or not. Unknown names are never asked."""
    before = len(encodings._cache)
    for i in range(500):
        # a name the email package reads as a charset whatever the gateway's
        # checks make of it: with a space, a tab, a non-ASCII letter in it
        for name in (f"x-{i:05d}", f"x {i}", f"x\t{i}", f"x\u00e9{i}"):
            with pytest.raises(Problem):
                email_body.email_request(_body(f"=?{name}?q?a?="))
    assert len(encodings._cache) - before <= 2  # what the sending of a refusal asks


def test_no_header_is_parsed_at_a_cost_that_grows_past_bounds() -> None:
    """The email package's parse of a header grows with the square of its
    encoded words: a header of 20,000 of them (320 KB, well within a body)
    took 5.5 s and 3.1 GB of memory, a From of 8,000 3 s and 953 MB. A
    header holds at most 64; a caller's own header is at most 4,096
    characters, there are at most 50, and none is Content-Disposition,
    whose RFC 2231 parameters name charsets too."""
    words = ["=?utf-8?q?abc?="] * (email_body.MAX_ENCODED_WORDS + 1)
    many = " ".join(words)
    for over in ({"headers": {"X-Note": many}}, {"subject": many},
                 {"from": f"{many} <agent@example.com>"},
                 {"to": [f"{w} <a{i}@example.com>" for i, w in enumerate(words)]},
                 {"headers": {"X-Note": "v" * (email_body.MAX_HEADER_VALUE + 1)}},
                 {"headers": {f"X-N{i}": "v" for i in range(51)}},
                 {"headers": {"Content-Disposition": "inline; filename*=x-made-up''abc"}}):
        with pytest.raises(Problem) as refused:
            email_body.email_request({**_body("plain"), **over})
        assert refused.value.code == "bad_request"
    email_body.email_request({**_body("plain"), "headers": {
        "X-Note": " ".join(words[1:]), "References": "<a@example.com> " * 200}})


def test_an_encoded_word_split_over_two_addresses_is_read_as_the_header_holds_it() -> None:
    """Each address was checked alone, but the To header joins them: a word
    opened in one display name and closed in the next was one encoded word
    to the email package, its charset looked up (and kept, a made-up one),
    the caller's names rewritten. The joined header is checked."""
    before = len(encodings._cache)
    for i in range(200):
        for field in ("to", "cc"):
            with pytest.raises(Problem):
                email_body.email_request({**_body("plain"), field: [
                    f"=?x-{i}?q?a <a@example.com>", "?= <d@example.com>"]})
    assert len(encodings._cache) - before <= 2
