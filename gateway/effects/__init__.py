"""One effect's run, admission to answer (effect.py): one attempt and its
deadline (attempt.py, deadline.py), resends, pacing and rate limits, slots,
fingerprints, and the record of fence rejections."""
