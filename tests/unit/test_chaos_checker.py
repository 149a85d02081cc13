"""The chaos checker must catch what it exists to catch: fed histories with a
planted violation, it reports it; fed a clean one, it reports nothing."""

from __future__ import annotations

from typing import Any

from tests.chaos.checker import check, provider_key

CLIENT = "chaos"


def claim(resource: str, fence: int, granted: float, expires: float,
          renews: bool = False) -> dict[str, Any]:
    return {"ev": "claim", "wall": granted, "resource": resource, "fence": fence,
            "granted": granted, "expires": expires, "renews": renews, "owner": "w"}


def attempt(key: str, resource: str, fence: int, t0: float, t1: float, status: int,
            code: str = "ok", kind: str = "http") -> dict[str, Any]:
    return {"ev": "attempt", "wall": t1, "key": key, "kind": kind, "resource": resource,
            "fence": fence, "t0": t0, "t1": t1, "status": status, "code": code}


def delivery(key: str, resource: str, fence: int, wall: float, accepted: bool = True,
             kind: str = "http") -> dict[str, Any]:
    return {"ev": "delivery", "wall": wall, "kind": kind,
            "key": provider_key(CLIENT, kind, key), "resource": resource, "fence": fence,
            "accepted": accepted}


def clean() -> list[dict[str, Any]]:
    return [claim("run:1", 10, 0.0, 1.0), attempt("k", "run:1", 10, 0.1, 0.2, 200),
            delivery("k", "run:1", 10, 0.15), claim("run:1", 11, 2.0, 3.0),
            attempt("k", "run:1", 11, 2.1, 2.2, 200, "replayed")]


def test_a_clean_history_passes() -> None:
    r = check(clean(), client=CLIENT, final_jobs={"completed": 3}, expected_jobs=3)
    assert r.ok, r.violations
    assert r.figures["deliveries"] == 1 and r.figures["duplicates"] == 0


def test_a_second_delivery_of_a_key_is_caught() -> None:
    events = [*clean(), delivery("k", "run:1", 11, 2.15)]
    assert any("delivered 2 times" in v for v in check(events, client=CLIENT).violations)


def test_a_resend_the_provider_deduped_is_not_a_duplicate() -> None:
    events = [*clean(), delivery("k", "run:1", 10, 0.5, accepted=False)]
    assert check(events, client=CLIENT).ok


def test_a_delivery_after_the_next_fence_was_granted_is_caught() -> None:
    events = [claim("run:1", 10, 0.0, 1.0), claim("run:1", 11, 1.5, 3.0),
              delivery("late", "run:1", 10, 1.6)]
    assert any("drain barrier" in v for v in check(events, client=CLIENT).violations)


def test_a_fence_never_granted_is_caught() -> None:
    events = [claim("run:1", 10, 0.0, 1.0), delivery("x", "run:1", 99, 0.5)]
    assert any("never granted" in v for v in check(events, client=CLIENT).violations)


def test_an_expired_lease_let_through_is_caught() -> None:
    events = [claim("run:1", 10, 0.0, 1.0), attempt("z", "run:1", 10, 1.2, 1.3, 200)]
    assert any("after its lease expired" in v
               for v in check(events, client=CLIENT).violations)
    renewed = [claim("run:1", 10, 0.0, 1.0, renews=True),
               attempt("z", "run:1", 10, 1.2, 1.3, 200)]
    assert check(renewed, client=CLIENT).ok


def test_answers_other_than_503_during_an_outage_are_caught() -> None:
    outage = {"ev": "fault", "wall": 5.0, "kind": "restart_postgres", "start": 5.0,
              "end": 7.0, "db_outage": True}
    events = [claim("run:1", 10, 0.0, 100.0, renews=True), outage,
              attempt("a", "run:1", 10, 5.5, 5.6, 503, "unavailable"),
              attempt("b", "run:1", 10, 5.5, 5.6, 200), delivery("b", "run:1", 10, 5.55)]
    violations = check(events, client=CLIENT).violations
    assert any("answered 200" in v for v in violations)
    assert any("every attempt fell in a database outage" in v for v in violations)
    assert len(violations) == 2


def test_lost_jobs_are_caught() -> None:
    r = check([], client=CLIENT, final_jobs={"completed": 8, "claimed": 1, "queued": 1},
              expected_jobs=10)
    assert any("2 jobs neither completed, dead nor cancelled" in v for v in r.violations)
    r = check([], client=CLIENT, final_jobs={"completed": 9}, expected_jobs=10)
    assert any("10 jobs enqueued, 9 found" in v for v in r.violations)


def cancel(job: int, answered: float, cancelled: bool = True,
           was: str | None = "claimed") -> dict[str, Any]:
    return {"ev": "cancel", "wall": answered, "job": job, "resource": f"job:soak:{job}",
            "cancelled": cancelled, "was": was, "answered": answered}


def final(job: int, state: str) -> dict[str, Any]:
    return {"ev": "job_final", "wall": 99.0, "job": job, "state": state}


def test_a_cancel_honoured_passes() -> None:
    events = [claim("job:soak:1", 10, 0.0, 5.0, renews=True),
              attempt("k", "job:soak:1", 10, 0.1, 0.2, 200), cancel(1, 1.0),
              attempt("k2", "job:soak:1", 10, 1.5, 1.6, 412, "lease_expired"),
              final(1, "cancelled"), cancel(2, 1.0, False, "completed"), final(2, "completed")]
    r = check(events, client=CLIENT)
    assert r.ok, r.violations
    assert r.figures["cancels"] == 1


def test_anything_that_counts_after_a_committed_cancel_is_caught() -> None:
    events = [claim("job:soak:1", 10, 0.0, 5.0, renews=True), cancel(1, 1.0),
              attempt("k", "job:soak:1", 10, 1.5, 1.6, 200), final(1, "completed"),
              cancel(2, 1.0, False, "completed"), final(2, "cancelled")]
    violations = check(events, client=CLIENT).violations
    assert any("after its cancel committed got through" in v for v in violations)
    assert any("job 1 was cancelled (it was claimed) but ended completed" in v
               for v in violations)
    assert any("job 2: its cancel found it completed, yet it ended cancelled" in v
               for v in violations)


def test_a_fence_issued_twice_is_caught() -> None:
    events = [claim("run:1", 10, 0.0, 1.0), claim("run:1", 10, 2.0, 3.0)]
    assert any("issued twice" in v for v in check(events, client=CLIENT).violations)


def test_a_body_cut_on_its_way_to_the_provider_is_caught() -> None:
    cut = {**delivery("k", "run:1", 10, 0.15), "whole": False}
    events = [e for e in clean() if e["ev"] != "delivery"] + [cut]
    assert any("body cut" in v for v in check(events, client=CLIENT).violations)


def test_an_answer_cut_on_its_way_back_is_caught() -> None:
    events = [*clean(), {**attempt("k", "run:1", 11, 2.3, 2.4, 200, "replayed"),
                         "whole": False}]
    assert any("answer cut" in v for v in check(events, client=CLIENT).violations)


def failover(start: float, end: float, kind: str = "failover") -> dict[str, Any]:
    return {"ev": "fault", "wall": end, "kind": kind, "start": start, "end": end,
            "db_outage": True}


def test_a_fence_below_one_granted_before_a_failover_is_caught() -> None:
    """On another resource too: fences are floored at the database clock, so
    a promoted standby issues fences above every fence issued before."""
    events = [claim("run:1", 1_000_000, 0.0, 1.0), failover(1.0, 3.0),
              claim("run:2", 999_999, 3.5, 4.5)]
    r = check(events, client=CLIENT)
    assert r.figures["fence_regressions"] == 1
    assert any("not above fence 1000000" in v for v in r.violations)


def test_fences_that_keep_rising_across_a_switchover_pass() -> None:
    events = [claim("run:1", 1_000_000, 0.0, 1.0), failover(1.0, 3.0, "switchover"),
              claim("run:1", 3_500_000, 3.5, 4.5), claim("run:2", 3_600_000, 3.6, 4.6)]
    r = check(events, client=CLIENT)
    assert r.ok, r.violations
    assert r.figures["fence_regressions"] == 0


def test_other_outages_are_not_failovers() -> None:
    """A restart of the one PostgreSQL is not a change of primary: the check
    looks only at switchovers and failovers."""
    events = [claim("run:1", 1_000_000, 0.0, 1.0),
              {**failover(1.0, 3.0), "kind": "restart_postgres"},
              claim("run:2", 999_999, 3.5, 4.5)]
    assert check(events, client=CLIENT).figures["fence_regressions"] == 0
