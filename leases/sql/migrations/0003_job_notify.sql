-- Wake idle workers when jobs arrive. Polling alone stays correct (behind
-- PgBouncer in transaction mode LISTEN does not work); this only cuts the wait.
CREATE FUNCTION fencegate_jobs_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('fencegate_jobs', q.queue)
       FROM (SELECT DISTINCT queue FROM new_jobs) AS q;
    RETURN NULL;
END
$$;

CREATE TRIGGER fencegate_jobs_notify
    AFTER INSERT ON fencegate_jobs
    REFERENCING NEW TABLE AS new_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION fencegate_jobs_notify();
