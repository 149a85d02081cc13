"""Every name on the wire, in one place: the headers, the problem codes and
their statuses, the words of an effect's life (the database's answers are
these words) and the metric labels. The server and ``GatewayClient`` both
import them from here, so the two cannot drift apart.

One outcome has one name: the database's admission verdict *is* the problem
code the caller gets (``stale_fence``, ``effect_in_progress``, ...), and an
attempt's end is one word from the provider's answer to the ledger's record.
Only the metric labels differ where the contract fixed them (``in_progress``,
``replayed``, ``provider_error``; a resend's ``answered``, ``not_acted``).
"""

from __future__ import annotations

from typing import Final, Literal, get_args

# ---- headers -------------------------------------------------------------------

FENCE_RESOURCE: Final = "Fence-Resource"
FENCE_TOKEN: Final = "Fence-Token"
IDEMPOTENCY_KEY: Final = "Idempotency-Key"
#: on a repeat answered from the ledger: nothing was sent
IDEMPOTENT_REPLAYED: Final = "Idempotent-Replayed"
#: on every answer the gateway made itself (not a provider's), with its code
PROBLEM_HEADER: Final = "Fencegate-Problem"
#: on a provider answer cut at max_body_bytes
TRUNCATED: Final = "Fencegate-Truncated"
RETRY_AFTER: Final = "Retry-After"

# ---- problems ------------------------------------------------------------------

FenceRefusal = Literal["stale_fence", "lease_expired", "no_lease", "invalid_fence"]
#: what admission can refuse with: the fence, or the key
Refusal = FenceRefusal | Literal["idempotency_key_reused", "effect_in_progress",
                                 "effect_outcome_unknown"]
ProblemCode = Refusal | Literal[
    "bad_request", "unauthenticated", "forbidden_resource", "forbidden_provider", "not_found",
    "method_not_allowed", "request_timeout", "lease_held", "lease_lost",
    "effect_not_unknown", "payload_too_large", "provider_rejected", "rate_limited",
    "internal_error", "provider_error", "provider_outcome_unknown", "unavailable",
    "overloaded", "provider_timeout",
]

#: code → (HTTP status, title)
PROBLEMS: dict[ProblemCode, tuple[int, str]] = {
    "bad_request": (400, "Bad request"),
    "unauthenticated": (401, "Unauthenticated"),
    "forbidden_resource": (403, "Resource not allowed for this client"),
    "forbidden_provider": (403, "Provider or path not allowed for this client"),
    "not_found": (404, "Not found"),
    "method_not_allowed": (405, "Method not allowed"),
    "request_timeout": (408, "Request body too slow"),
    "lease_held": (409, "Lease held by another owner"),
    "lease_lost": (409, "Lease lost"),
    "effect_in_progress": (409, "Effect in progress"),
    "effect_outcome_unknown": (409, "Effect outcome unknown"),
    "effect_not_unknown": (409, "Effect is not awaiting resolution"),
    "stale_fence": (412, "Stale fence"),
    "lease_expired": (412, "Lease expired"),
    "no_lease": (412, "No lease"),
    "invalid_fence": (412, "Invalid fence"),
    "payload_too_large": (413, "Payload too large"),
    "idempotency_key_reused": (422, "Idempotency key reused"),
    "provider_rejected": (422, "Provider rejected the effect"),
    "rate_limited": (429, "Rate limited"),
    "internal_error": (500, "Internal error"),
    "provider_error": (502, "Provider error"),
    "provider_outcome_unknown": (502, "Provider outcome unknown"),
    "unavailable": (503, "Unavailable"),
    "overloaded": (503, "Overloaded"),
    "provider_timeout": (504, "Provider timeout"),
}

FENCE_REFUSALS: frozenset[str] = frozenset(get_args(FenceRefusal))

# ---- an effect's life -------------------------------------------------------------
#
# Each vocabulary below has one meaning; a word two of them share means the
# same thing in both. The database's answers are these words exactly
# (leases/sql/schema.sql), and the metric labels are the contract's.

#: what ``fencegate_admit_effect`` (and, for a batch, ``fencegate_admit_effects``)
#: answers an attempt that asks to reach the provider (``Ledger.admit``; acted on
#: in effects/effect.py): go, a replay of the stored answer, a refusal (its
#: problem code), "abandoned" (the gateway had given the attempt up before its
#: admission ran), or, from a batch, "busy" (its lease row was held elsewhere:
#: admit it alone)
Verdict = Literal["admitted", "replay", "abandoned", "busy"] | Refusal

#: what the ledger holds for an effect: the ``state`` of ``fencegate_effects``
#: and of ``GET /v1/effects/{key}`` (``in_flight`` while an attempt may be
#: under way; an end once one is recorded)
EffectState = Literal["in_flight", "succeeded", "failed", "unknown"]

#: what one attempt came to, which is the end the ledger records for it:
#: ``succeeded`` (the provider acted) and ``failed`` (it refused for good), its
#: answer stored and replayed; ``unknown`` (it may have acted: never sent again
#: unless it dedupes on our key); ``free`` (it certainly did not act: the key
#: is freed, the effect forgotten). Said by a provider (``Outcome.kind``,
#: gateway/providers/), or by the gateway of an attempt that never reached one
#: (``Ledger.free``); written by ``fencegate_finish_effect`` (``Ledger.finish``,
#: ``Ledger.free``); the ``state`` label of fencegate_effect_records_given_up_total.
AttemptEnd = Literal["succeeded", "failed", "unknown", "free"]

#: what ``fencegate_finish_effect`` made of an attempt's end (``Ledger.free``
#: answers it): the end, recorded; ``unknown`` for a ``free`` when an earlier
#: attempt of the key may have acted (the key stays taken, the effect
#: unknown); ``gone`` when the attempt no longer held the key (already ended,
#: replaced by a later attempt or an operator's resolve, or never admitted)
Finished = AttemptEnd | Literal["gone"]

#: why ``fencegate_extend_effect`` refuses to extend an attempt for a resend:
#: its fence (the admission's words for it), the attempt no longer in flight
#: under its nonce, or the provider's window too short for the whole resend
ExtendRefusal = Literal["stale_fence", "lease_expired", "no_lease", "not_in_flight",
                        "outside_window"]
#: what ``fencegate_extend_effect`` answers before a resend (``Ledger.extend``;
#: acted on in effects/resend.py): go, or why not
ExtendVerdict = Literal["extended"] | ExtendRefusal

# ---- metric labels ----------------------------------------------------------------

#: the ``outcome`` label of ``fencegate_effects_total`` (the contract's words;
#: counted in effects/effect.py): an attempt's end by its own name, except a
#: ``free`` one, counted by why nothing was done (``provider_error``, or
#: ``overloaded``: the gateway could not start it in time); and the answers
#: made without the provider (``replayed``; ``in_progress``, the refusal
#: ``effect_in_progress``; ``rate_limited``)
EffectOutcome = Literal["succeeded", "failed", "unknown", "replayed", "in_progress",
                        "provider_error", "rate_limited", "overloaded"]

#: the ``outcome`` label of ``fencegate_provider_resends_total`` (counted in
#: effects/resend.py): what a resend came to (``answered``: its end was
#: ``succeeded`` or ``failed``; ``unknown`` again; ``not_acted``: ``free``),
#: or why none went out (the ledger's ``ExtendRefusal``, ``provider_paused``,
#: or ``unavailable``: no answer from the database)
ResendOutcome = Literal["answered", "unknown", "not_acted", "provider_paused",
                        "unavailable"] | ExtendRefusal

#: why an effect was refused 429 ``rate_limited`` (``fencegate_rate_limited_total``):
#: the provider's configured rate, or a pause the provider asked for (its 429)
RateLimitReason = Literal["configured_rate", "provider_paused"]


def header_text(value: str) -> str:
    """A provider's header value as text the caller's answer, and PostgreSQL's
    copy of it for replays, carry alike. One that was not UTF-8 reaches us
    with its bytes kept as lone surrogates (aiohttp decodes with
    surrogateescape), which aiohttp's writer drops and jsonb refuses: read
    those bytes as Latin-1, as HTTP reads header bytes (RFC 9110, obs-text)."""
    try:
        value.encode()
        return value
    except UnicodeEncodeError:
        try:
            return value.encode("utf-8", "surrogateescape").decode("latin-1")
        except UnicodeEncodeError:  # surrogates no decoder made: replaced
            return value.encode("utf-8", "replace").decode()
