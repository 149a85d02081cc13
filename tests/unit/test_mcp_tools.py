"""The pure parts of ``fencegate mcp``: a tool's arguments checked against
its schema with a message naming the argument, the derived idempotency key,
the ``--http`` address and the command's refusals (issue 27)."""

from __future__ import annotations

import re
import subprocess

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.errors import ConfigError
from gateway.mcp import arguments, specs
from gateway.mcp.serve import host_port
from gateway.mcp.tools import derived_key
from tests.support.served import FENCEGATE

EMAIL = specs.BY_NAME["send_email"].input_schema


@pytest.mark.parametrize(("args", "names"), [
    ({"to": ["a@b.c"]}, "'subject' is required"),
    ({"to": "a@b.c", "subject": "x"}, "'to' must be an array"),
    ({"to": [], "subject": "x"}, "'to' must have at least 1"),
    ({"to": [7], "subject": "x"}, "'to[]' must be a string"),
    ({"to": ["a@b.c"], "subject": "x", "attach": 1}, "unknown argument 'attach'"),
    ([1, 2], "must be a JSON object"),
])
def test_bad_arguments_name_what_is_wrong(args: object, names: str) -> None:
    with pytest.raises(arguments.BadArguments, match=re.escape(names)):
        arguments.check(EMAIL, args)


def test_method_ttl_and_resource_are_checked() -> None:
    http = specs.BY_NAME["http_request"].input_schema
    with pytest.raises(arguments.BadArguments, match="'method' must be one of"):
        arguments.check(http, {"provider": "crm", "method": "TRACE", "path": "x"})
    claim = specs.BY_NAME["claim_run"].input_schema
    with pytest.raises(arguments.BadArguments, match="'ttl_seconds' must be at least"):
        arguments.check(claim, {"resource": "run:1", "ttl_seconds": 0})
    with pytest.raises(arguments.BadArguments, match="'ttl_seconds' must be a number"):
        arguments.check(claim, {"resource": "run:1", "ttl_seconds": True})
    with pytest.raises(arguments.BadArguments, match="'resource'"):
        arguments.check(claim, {"resource": "run 1"})
    assert arguments.check(claim, {"resource": "run:1", "ttl_seconds": None}) == \
        {"resource": "run:1"}


@given(st.dictionaries(st.sampled_from(["to", "subject", "text", "cc"]),
                       st.text(max_size=5), min_size=1))
def test_the_derived_key_ignores_key_order_and_names_the_run(args: dict[str, str]) -> None:
    backwards = dict(reversed(list(args.items())))
    key = derived_key("send_email", "run:1", args)
    assert key == derived_key("send_email", "run:1", backwards)
    assert key != derived_key("send_email", "run:2", args)
    assert key != derived_key("http_request", "run:1", args)
    assert 1 <= len(key) <= 255 and key.isascii() and key.isprintable()


def test_http_addresses() -> None:
    assert host_port("127.0.0.1:8765") == ("127.0.0.1", 8765)
    assert host_port("[::1]:80") == ("::1", 80)
    for bad in ("8765", "host:", ":80", "h:0", "h:99999", "h:x"):
        with pytest.raises(ConfigError, match="HOST:PORT"):
            host_port(bad)


@pytest.mark.parametrize(("argv", "env", "says"), [
    (["--gateway", "http://127.0.0.1:1"], {}, "FENCEGATE_API_KEY"),
    (["--gateway", "127.0.0.1:1"], {"FENCEGATE_API_KEY": "k"}, "--gateway"),
    (["--gateway", "http://127.0.0.1:1", "--http", "nope"], {"FENCEGATE_API_KEY": "k"},
     "HOST:PORT"),
])
def test_the_command_refuses_with_a_clear_message(argv: list[str], env: dict[str, str],
                                                  says: str) -> None:
    import os
    environ = {k: v for k, v in os.environ.items() if k != "FENCEGATE_API_KEY"}
    done = subprocess.run([*FENCEGATE, "mcp", *argv], env={**environ, **env},
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 2, done.stderr
    assert says in done.stderr and "Traceback" not in done.stderr


def test_a_port_in_use_is_named() -> None:
    import os
    import socket
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = subprocess.run(
            [*FENCEGATE, "mcp", "--gateway", "http://127.0.0.1:1", "--http", f"127.0.0.1:{port}"],
            env={**os.environ, "FENCEGATE_API_KEY": "k"}, capture_output=True, text=True,
            timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 2, done.stderr
    assert f"127.0.0.1:{port}" in done.stderr and "in use" in done.stderr
    assert "Traceback" not in done.stderr
