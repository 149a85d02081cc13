"""A database's applied migrations must be this code's files, byte for byte:
an edited migration, or a pre-release database made before the baseline, is
refused with what to do (leases.migrate.mismatches, pure)."""

from __future__ import annotations

from leases import sql
from leases.migrate import checksum, mismatches

FILES = [(1, "baseline", "CREATE TABLE a ();"), (2, "more", "ALTER TABLE a ADD b int;")]


def applied(*versions: int) -> list[tuple[int, str, str | None]]:
    return [(v, n, checksum(t)) for v, n, t in FILES if v in versions]


def test_the_same_files_pass_and_a_newer_database_is_left_to_the_version_check() -> None:
    assert mismatches(applied(1, 2), FILES) is None
    assert mismatches(applied(1), FILES) is None
    assert mismatches([*applied(1, 2), (3, "newer", "x")], FILES) is None


def test_an_edited_migration_is_refused() -> None:
    edited = [FILES[0], (2, "more", "ALTER TABLE a ADD c int;")]
    why = mismatches(applied(1, 2), edited)
    assert why is not None and "migration 2 (more) differs" in why and "never edited" in why


def test_a_pre_release_database_is_refused_with_what_to_do() -> None:
    for old in ([(1, "leases", checksum(FILES[0][2]))], [(1, "baseline", None)]):
        why = mismatches(old, FILES)
        assert why is not None and "pre-release" in why and ".fencegate/pgdata" in why


def test_the_repository_starts_from_one_baseline() -> None:
    versions = [(v, n) for v, n, _ in sql.migrations()]
    assert versions[0] == (1, "baseline")
    assert [v for v, _ in versions] == list(range(1, len(versions) + 1))
