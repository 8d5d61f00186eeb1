-- The versions table's two guards fire once a statement, over the statement's new rows, not once a row (issue 51).
--
-- A batch commit inserts its versions with one statement, but a row trigger ran its PL/pgSQL, and the
-- statements in it, again for every row: a forgotten-user check, an outcome row and an outbox row, each with
-- its executor set-up. An AFTER ... FOR EACH STATEMENT trigger with a transition table sees the statement's rows
-- at once, so each guard is one set-based statement whatever the batch's size. A commit of 25 jobs costs
-- PostgreSQL 0.85-0.87 times the CPU it did (docs/benchmarks.md, "The versions' triggers, once a statement").

-- What a caller sees does not change:
-- - every insert into attune_personal_versions, by any path (the batch commit, a device's upload, a rebase,
--   a restore), still writes the `completed` outcome and the outbox row of each producer's job id, in the
--   same statement, so in the same (sub)transaction;
-- - a version of a forgotten user is still refused with SQLSTATE AT409, which the batch commit reports as
--   "head moved". The refusal now comes at the end of the insert statement rather than at the row; either way
--   the statement fails and leaves nothing behind, large objects included.
--
-- Expand-only: the release before this one references neither trigger, and runs the same on these.

DROP TRIGGER attune_personal_versions_forgotten ON attune_personal_versions;
DROP TRIGGER attune_personal_versions_outcome ON attune_personal_versions;
DROP FUNCTION attune_refuse_forgotten();
DROP FUNCTION attune_record_completed();

CREATE FUNCTION attune_refuse_forgotten_versions() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM new_versions v JOIN attune_forgotten_users f
                 ON f.user_sha256 = sha256(convert_to(v.user_id, 'UTF8')) AND f.model IN ('', v.model)) THEN
        RAISE EXCEPTION 'user forgotten' USING ERRCODE = 'AT409';
    END IF;
    RETURN NULL;
END $$;

-- Only a producer's job id ([A-Za-z0-9_-]): a rollback's version (`rollback:…`) is no job, and no event is owed.
-- job_id is unique in attune_personal_versions, so no statement's rows name one twice (ON CONFLICT DO UPDATE
-- would refuse that).
CREATE FUNCTION attune_record_completed_versions() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- The outbox is fed from the outcome insert's RETURNING (inserted and updated rows alike), so the statement's
    -- rows are scanned and matched against the job-id pattern once.
    WITH done AS (
        INSERT INTO attune_job_outcomes AS o
            (job_id, state, user_id, model, version, loss, samples, duration_seconds, validation, worker)
        SELECT v.job_id, 'completed', v.user_id, v.model, v.version, v.loss, v.samples, v.duration_seconds,
               v.validation, v.worker
        FROM new_versions v WHERE v.job_id ~ '^[A-Za-z0-9_-]{1,128}$'
        ON CONFLICT (job_id) DO UPDATE SET
            state = 'completed', user_id = EXCLUDED.user_id, model = EXCLUDED.model, version = EXCLUDED.version,
            loss = EXCLUDED.loss, samples = EXCLUDED.samples, duration_seconds = EXCLUDED.duration_seconds,
            validation = EXCLUDED.validation, reason = NULL, dead_lettered = false, cancel_stage = NULL,
            worker = EXCLUDED.worker, updated_at = now()
        RETURNING o.job_id, o.worker)
    INSERT INTO attune_outbox (job_id, worker)
    SELECT job_id, worker FROM done
    ON CONFLICT (job_id) DO UPDATE SET worker = EXCLUDED.worker, created_at = clock_timestamp();
    RETURN NULL;
END $$;

-- AFTER triggers of one event fire in the order of their names: the refusal first, so a forgotten user's
-- statement fails before any outcome is written (it would be undone with the statement anyway).
CREATE TRIGGER attune_personal_versions_1_forgotten AFTER INSERT ON attune_personal_versions
    REFERENCING NEW TABLE AS new_versions
    FOR EACH STATEMENT EXECUTE FUNCTION attune_refuse_forgotten_versions();
CREATE TRIGGER attune_personal_versions_2_outcome AFTER INSERT ON attune_personal_versions
    REFERENCING NEW TABLE AS new_versions
    FOR EACH STATEMENT EXECUTE FUNCTION attune_record_completed_versions();
