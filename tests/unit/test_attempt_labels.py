"""What an attempt came to is counted under the labels the contract fixed
(gateway/wire.py): ``fencegate_effects_total`` by its end, a free one by why
nothing was done; ``fencegate_provider_resends_total`` by what a resend
came to. Pure rules."""

from __future__ import annotations

import pytest

from gateway import metrics
from gateway.effects import effect, resend
from gateway.providers import too_late
from gateway.providers.base import Outcome, problem_outcome
from gateway.wire import AttemptEnd, EffectOutcome, ResendOutcome
from tests.support.vocabulary import words

#: the contract's labels (its Metrics table), and the amendment's ``overloaded``
CONTRACT_OUTCOMES = {"succeeded", "failed", "unknown", "replayed", "in_progress",
                     "provider_error", "rate_limited", "overloaded"}


def _ended(end: AttemptEnd) -> Outcome:
    return problem_outcome(end, "provider_error", "detail", "summary")


def test_the_label_sets_are_the_contracts() -> None:
    assert set(metrics.EFFECT_OUTCOMES) == CONTRACT_OUTCOMES
    assert set(metrics.REJECTION_REASONS) == {"stale_fence", "lease_expired", "no_lease",
                                              "invalid_fence"}


@pytest.mark.parametrize(("end", "label"), [
    ("succeeded", "succeeded"), ("failed", "failed"), ("unknown", "unknown"),
    ("free", "provider_error"),
])
def test_an_end_counts_under_its_own_name_a_free_one_as_provider_error(
        end: AttemptEnd, label: str) -> None:
    counted = effect._counted_as(_ended(end))
    assert counted == label and counted in words(EffectOutcome)


def test_a_free_end_the_gateway_could_not_start_counts_as_overloaded() -> None:
    outcome = too_late("hook")
    assert outcome.kind == "free"
    assert effect._counted_as(outcome) == "overloaded"


@pytest.mark.parametrize(("end", "label"), [
    ("succeeded", "answered"), ("failed", "answered"), ("unknown", "unknown"),
    ("free", "not_acted"),
])
def test_a_resend_counts_by_what_it_came_to(end: AttemptEnd, label: str) -> None:
    counted = resend._counted_as(_ended(end))
    assert counted == label and counted in words(ResendOutcome)
