-- The planner's estimate of fencegate_claim_lease: the one row it returns,
-- not a set-returning function's default of 1,000. Told 1,000, the planner
-- joined a job claim's new leases to fencegate_jobs with a hash join over a
-- sequential scan of every job row: 1.2 ms of a 1.7 ms claim of 8 jobs at
-- 8,000 rows, growing with the table (finished jobs stay for their
-- retention). Told 1, it looks each job up by its primary key.
-- Additive: a planner estimate; no code sees it.

ALTER FUNCTION fencegate_claim_lease(text, text, double precision, boolean) ROWS 1;
