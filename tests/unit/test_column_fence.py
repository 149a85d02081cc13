"""The storage-side fence's statements (leases/column_fence.py): every name
quoted, the fence repeated in the statement's own condition."""

from __future__ import annotations

import pytest

from leases.column_fence import fenced_update, fenced_upsert, quote_name


def test_names_are_quoted_and_qualified() -> None:
    assert quote_name("orders") == '"orders"'
    assert quote_name('we"ird') == '"we""ird"'
    assert quote_name(("app", "orders")) == '"app"."orders"'
    for bad in ("", ("app", ""), "a\x00b", ()):
        with pytest.raises(ValueError):
            quote_name(bad)


def test_an_update_writes_only_under_a_fence_at_least_the_rows() -> None:
    assert fenced_update("orders", "id", ["status", "total"]) == (
        'UPDATE "orders" SET "status" = $2, "total" = $3, "fence" = $4 '
        'WHERE "id" = $1 AND "fence" <= $4 RETURNING "fence"')


def test_an_upsert_updates_only_under_a_fence_at_least_the_rows() -> None:
    assert fenced_upsert(("app", "orders"), "id", ["status"], fence_column="epoch") == (
        'INSERT INTO "app"."orders" AS existing ("id", "status", "epoch") VALUES ($1, $2, $3) '
        'ON CONFLICT ("id") DO UPDATE SET "status" = excluded."status", '
        '"epoch" = excluded."epoch" WHERE existing."epoch" <= excluded."epoch" '
        'RETURNING "epoch"')


def test_the_fence_column_cannot_be_written_as_data() -> None:
    with pytest.raises(ValueError):
        fenced_update("orders", "id", ["fence"])
    with pytest.raises(ValueError):
        fenced_upsert("orders", "id", ["id"])
