"""The chaos checker's fenced-write rules must catch what they exist to catch:
fed the database's order of grants and commits, its rows and jobs and the
workers' recorded outcomes with a planted violation, it reports it; fed a
clean history, nothing."""

from __future__ import annotations

from typing import Any

from tests.chaos.checker import check

CLIENT = "chaos"


def grant(seq: int, resource: str, fence: int) -> dict[str, Any]:
    return {"ev": "db_order", "wall": 9.0, "seq": seq, "kind": "grant", "resource": resource,
            "fence": fence, "write_id": None}


def commit(seq: int, resource: str, fence: int) -> dict[str, Any]:
    return {"ev": "db_order", "wall": 9.0, "seq": seq, "kind": "commit", "resource": resource,
            "fence": fence, "write_id": f"{resource}@{fence}"}


def row(resource: str, fence: int, job: int | None = None) -> dict[str, Any]:
    return {"ev": "db_write", "wall": 9.0, "write_id": f"{resource}@{fence}",
            "resource": resource, "fence": fence, "job": job}


def job(job_id: int, state: str, result_ref: str | None = None) -> dict[str, Any]:
    return {"ev": "db_job", "wall": 9.0, "id": job_id, "state": state, "result_ref": result_ref}


def attempt(resource: str, fence: int, outcome: str, code: str = "ok",
            job_id: int | None = None) -> dict[str, Any]:
    return {"ev": "fenced", "wall": 1.0, "owner": "w", "write_id": f"{resource}@{fence}",
            "resource": resource, "fence": fence, "job": job_id, "t0": 0.5, "t1": 1.0,
            "outcome": outcome, "code": code}


def clean() -> list[dict[str, Any]]:
    """A zombie (fence 10) refused after the takeover (fence 11) wrote; a job
    whose first attempt's COMMIT got no answer but committed; a job refused
    once, then completed under its next fence."""
    return [
        grant(1, "acct:1", 10), grant(2, "acct:1", 11), commit(3, "acct:1", 11),
        attempt("acct:1", 11, "committed"), attempt("acct:1", 10, "refused", "stale_fence"),
        row("acct:1", 11),
        grant(4, "job:soak:7", 20), commit(5, "job:soak:7", 20),
        attempt("job:soak:7", 20, "unknown", "TimeoutError", 7), row("job:soak:7", 20, 7),
        job(7, "completed", "job:soak:7@20"),
        grant(6, "job:soak:8", 30), attempt("job:soak:8", 30, "refused", "lease_expired", 8),
        grant(7, "job:soak:8", 31), commit(8, "job:soak:8", 31),
        attempt("job:soak:8", 31, "committed", job_id=8), row("job:soak:8", 31, 8),
        job(8, "completed", "job:soak:8@31"),
    ]


def violations(events: list[dict[str, Any]]) -> list[str]:
    return check(events, client=CLIENT).violations


def test_a_clean_history_of_fenced_writes_passes() -> None:
    r = check(clean(), client=CLIENT)
    assert r.ok, r.violations
    assert r.figures["fenced_rows"] == 3
    assert r.figures["fenced_unknown"] == r.figures["fenced_unknown_committed"] == 1
    assert r.figures["fenced_stale_commits"] == r.figures["fenced_torn_jobs"] == 0


def test_a_commit_under_a_fence_older_than_one_granted_is_caught() -> None:
    """The zombie's write committed after the takeover's grant, in the
    database's order: the fence check let an overlap through."""
    events = [grant(1, "acct:1", 10), grant(2, "acct:1", 11), commit(3, "acct:1", 10),
              attempt("acct:1", 10, "committed"), row("acct:1", 10)]
    found = violations(events)
    assert any("under fence 10 after fence 11 was granted" in v for v in found), found
    assert check(events, client=CLIENT).figures["fenced_stale_commits"] == 1


def test_the_same_commit_before_the_next_grant_passes() -> None:
    """Committed while fence 10 was still current, even if it expired: fine."""
    events = [grant(1, "acct:1", 10), commit(2, "acct:1", 10), grant(3, "acct:1", 11),
              attempt("acct:1", 10, "committed"), row("acct:1", 10)]
    assert violations(events) == []


def test_a_commit_under_a_fence_never_granted_is_caught() -> None:
    events = [grant(1, "acct:1", 10), commit(2, "acct:1", 12), row("acct:1", 12)]
    assert any("never granted" in v for v in violations(events))


def test_a_refused_write_in_the_table_is_caught() -> None:
    events = [*clean(), grant(9, "acct:2", 40), commit(10, "acct:2", 40),
              attempt("acct:2", 40, "refused", "lease_expired"), row("acct:2", 40)]
    assert any("answered refused (lease_expired) but is in the table" in v
               for v in violations(events))


def test_a_write_that_failed_before_its_commit_in_the_table_is_caught() -> None:
    events = [*clean(), grant(9, "acct:2", 40), commit(10, "acct:2", 40),
              attempt("acct:2", 40, "failed", "ConnectionDoesNotExistError"), row("acct:2", 40)]
    assert any("answered failed" in v for v in violations(events))


def test_a_write_answered_committed_but_missing_is_caught() -> None:
    events = [*clean(), grant(9, "acct:2", 40), attempt("acct:2", 40, "committed")]
    assert any("answered committed but is not in the table" in v for v in violations(events))


def test_a_job_completed_without_its_row_is_caught() -> None:
    events = [e for e in clean() if not (e["ev"] == "db_write" and e["job"] == 8)
              and not (e["ev"] == "db_order" and e["resource"] == "job:soak:8"
                       and e["kind"] == "commit")]
    assert any("job 8 completed without its row" in v for v in violations(events))


def test_a_row_whose_job_is_not_completed_is_caught() -> None:
    events = [e for e in clean() if not (e["ev"] == "db_job" and e["id"] == 8)]
    events.append(job(8, "queued"))
    assert any("job 8 is queued but its row job:soak:8@31 committed" in v
               for v in violations(events))


def test_a_job_with_two_rows_is_caught() -> None:
    events = [*clean(), commit(9, "job:soak:8", 30), row("job:soak:8", 30, 8)]
    found = violations(events)
    assert any("job 8 has 2 rows" in v for v in found), found
    # and the older fence's commit after the newer grant is an overlap too
    assert any("under fence 30 after fence 31" in v for v in found), found


def test_a_completion_naming_another_row_is_caught() -> None:
    events = [e for e in clean() if not (e["ev"] == "db_job" and e["id"] == 8)]
    events.append(job(8, "completed", "job:soak:8@30"))
    assert any("completed naming job:soak:8@30" in v for v in violations(events))


def test_a_row_in_the_table_missing_from_the_commit_order_is_caught() -> None:
    events = [*clean(), row("acct:3", 50)]
    assert any("in the table but not in the commit order" in v for v in violations(events))
