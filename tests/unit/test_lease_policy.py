"""The pure rules of the lease client."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from leases import InvalidArgument, RenewalPolicy, policy, sql

ttls = st.floats(min_value=policy.MIN_TTL_SECONDS, max_value=policy.MAX_TTL_SECONDS)
# a monotonic clock's reading: up to a year of uptime
instants = st.floats(min_value=0, max_value=3.2e7)


@given(ttl=ttls, sent_at=instants)
def test_local_deadline_falls_before_the_server_expiry_by_the_margin(
    ttl: float, sent_at: float
) -> None:
    p = RenewalPolicy(ttl)
    assert p.deadline(sent_at) <= sent_at + ttl - p.margin + 1e-6
    assert p.deadline(sent_at) < sent_at + ttl


@given(ttl=ttls, sent_at=instants)
def test_renewal_is_due_before_the_local_deadline(ttl: float, sent_at: float) -> None:
    p = RenewalPolicy(ttl)
    assert sent_at < p.next_renewal(sent_at) < p.deadline(sent_at)


@given(
    ttl=ttls,
    renew=st.floats(min_value=0.01, max_value=0.6),
    margin=st.floats(min_value=0.01, max_value=0.35),
    sent_at=instants,
    elapsed=st.floats(min_value=0, max_value=1e6),
)
def test_a_retry_never_lands_after_the_deadline(
    ttl: float, renew: float, margin: float, sent_at: float, elapsed: float
) -> None:
    p = RenewalPolicy(ttl, renew_fraction=renew, margin_fraction=margin,
                      retry_fraction=min(renew, 0.05))
    deadline = p.deadline(sent_at)
    now = sent_at + elapsed
    assert p.retry_at(now, deadline) <= deadline


def test_a_policy_with_no_room_to_renew_is_refused() -> None:
    with pytest.raises(InvalidArgument):
        RenewalPolicy(10, renew_fraction=0.9, margin_fraction=0.2)
    with pytest.raises(InvalidArgument):
        RenewalPolicy(0)


@pytest.mark.parametrize("resource", ["run:1", "a", "x" * 200, "lead:a.b_c/d@e-f"])
def test_resources_in_the_contract_alphabet_pass(resource: str) -> None:
    assert policy.check_resource(resource) == resource


@pytest.mark.parametrize("resource", ["", "x" * 201, "run 1", "run\n1", "é", "a*b"])
def test_resources_outside_the_alphabet_are_refused(resource: str) -> None:
    with pytest.raises(InvalidArgument):
        policy.check_resource(resource)


@pytest.mark.parametrize("fence", [0, -1, 2**63, True, "1"])
def test_fences_outside_64_bits_are_refused(fence: object) -> None:
    with pytest.raises(InvalidArgument):
        policy.check_fence(fence)  # type: ignore[arg-type]


def test_owner_ids_are_unique_per_process_and_stable_within_it() -> None:
    assert policy.default_owner() == policy.default_owner()
    assert str(__import__("os").getpid()) in policy.default_owner()


def test_every_query_parses_and_names_are_unique() -> None:
    text = "-- name: a\nSELECT 1;\n-- name: b\nSELECT 2;\n"
    assert sql.parse_queries(text) == {"a": "SELECT 1", "b": "SELECT 2"}
    with pytest.raises(ValueError):
        sql.parse_queries("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;\n")
    for name in ("claim_lease", "renew_lease", "release_lease", "admit_effect"):
        assert sql.query(name)
