-- What became of each job id, where a producer can ask (`attune job show`, `GET /api/jobs/ID`), and an
-- outbox of the terminal events not yet confirmed by the broker.
--
-- attune_job_outcomes: one row per job id the fleet has settled. `completed` rows are written by a trigger on
-- attune_personal_versions, so in the very transaction (and subtransaction) that commits the version; the
-- other states are written by the worker just before it settles the delivery on the broker. A `held` version
-- and a cancel that came too late are read from their own tables when asked (a hold can be released later).
CREATE TABLE attune_job_outcomes (
    job_id            text             PRIMARY KEY,
    state             text             NOT NULL CHECK (state IN ('completed', 'failed', 'retrying', 'cancelled', 'forgotten')),
    -- NULL once the user is forgotten (`attune user forget`): the row keeps only that the job ended so.
    user_id           text,
    model             text,
    version           integer,
    loss              double precision,
    samples           integer,
    duration_seconds  double precision,
    validation        jsonb,
    reason            text,
    -- Transient failures so far (what the retry queues count); kept when the job then completes.
    attempts          integer          NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    dead_lettered     boolean          NOT NULL DEFAULT false,
    cancel_stage      text,
    -- Deliveries of the id after it was applied (a redelivery, a re-publish), acknowledged untrained.
    duplicates        integer          NOT NULL DEFAULT 0 CHECK (duplicates >= 0),
    worker            text,
    updated_at        timestamptz      NOT NULL DEFAULT now()
);
CREATE INDEX attune_job_outcomes_user ON attune_job_outcomes (user_id, model);

-- Terminal events written with their outcome and not yet confirmed by the broker. The worker that settled the
-- job deletes its row once the broker confirms the event; a row older than the grace period belongs to a
-- worker that died in between, and any worker's outbox relay publishes it again (FOR UPDATE SKIP LOCKED).
CREATE TABLE attune_outbox (
    job_id      text        PRIMARY KEY,
    worker      text        NOT NULL,
    -- When the row was written, not when its transaction began (a commit may wait on locks first): the grace
    -- period is counted from here.
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX attune_outbox_created ON attune_outbox (created_at);

-- Only a producer's job id ([A-Za-z0-9_-]): a rollback's version (`rollback:…`) is no job, and no event is owed.
CREATE FUNCTION attune_record_completed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.job_id !~ '^[A-Za-z0-9_-]{1,128}$' THEN
        RETURN NULL;
    END IF;
    INSERT INTO attune_job_outcomes AS o
        (job_id, state, user_id, model, version, loss, samples, duration_seconds, validation, worker)
    VALUES (NEW.job_id, 'completed', NEW.user_id, NEW.model, NEW.version, NEW.loss, NEW.samples,
            NEW.duration_seconds, NEW.validation, NEW.worker)
    ON CONFLICT (job_id) DO UPDATE SET
        state = 'completed', user_id = EXCLUDED.user_id, model = EXCLUDED.model, version = EXCLUDED.version,
        loss = EXCLUDED.loss, samples = EXCLUDED.samples, duration_seconds = EXCLUDED.duration_seconds,
        validation = EXCLUDED.validation, reason = NULL, dead_lettered = false, cancel_stage = NULL,
        worker = EXCLUDED.worker, updated_at = now();
    INSERT INTO attune_outbox (job_id, worker) VALUES (NEW.job_id, NEW.worker)
    ON CONFLICT (job_id) DO UPDATE SET worker = EXCLUDED.worker, created_at = clock_timestamp();
    RETURN NULL;
END $$;

CREATE TRIGGER attune_personal_versions_outcome AFTER INSERT ON attune_personal_versions
    FOR EACH ROW EXECUTE FUNCTION attune_record_completed();

-- Versions committed before this migration have their outcome too.
INSERT INTO attune_job_outcomes (job_id, state, user_id, model, version, loss, samples, duration_seconds, validation, worker, updated_at)
SELECT job_id, 'completed', user_id, model, version, loss, samples, duration_seconds, validation, worker, created_at
FROM attune_personal_versions WHERE job_id ~ '^[A-Za-z0-9_-]{1,128}$'
ON CONFLICT (job_id) DO NOTHING;
