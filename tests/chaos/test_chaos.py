"""A small chaos run inside `make test`: a few zombie trials, a few rounds of
batches mixing stale and current fences, a few zombies' fenced database
writes, and a short soak (a fifth of its jobs fenced database writes) that
meets every kind of fault once. `make chaos` runs the full one."""

from __future__ import annotations

import random

from tests.chaos.run import markdown, run
from tests.chaos.scenarios import FAULTS


async def test_a_small_chaos_run_finds_no_violation() -> None:
    seed = random.SystemRandom().randrange(2**31)
    faults = list(FAULTS)
    random.Random(seed).shuffle(faults)
    r = await run(seed, trials=12, lanes=2, workers=3, effects=200, spread=12.0,
                  faults=faults, slow_fraction=0.02, soak_limit=75, mixed_rounds=4,
                  fenced_trials=6)
    assert r.report.ok, f"seed {seed}:\n" + markdown(r)
    assert r.trials.trials == 12
    assert r.mixed.rounds == 4
    # in every round the zombie's stale fences were refused, the holder's went through
    assert r.mixed.outcomes["412 stale_fence"] > 0 and r.mixed.outcomes["200 ok"] > 0, \
        r.mixed.outcomes
    assert r.report.figures["deliveries"] > 0
    # cancels and snoozes raced the workers (checked: nothing counted after a cancel)
    assert r.report.figures["cancels"] + r.report.figures["cancels_too_late"] > 0
    assert r.report.figures["snoozes"] > 0
    assert sum(r.soak.faults.values()) == len(FAULTS)
    assert r.fenced.trials == 6
    fenced = r.report.figures["fenced_outcomes"]
    assert any(k.startswith("committed") for k in fenced), fenced
    assert r.report.figures["fenced_rows"] > 0
