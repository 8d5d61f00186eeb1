-- Samples kept on purpose (`attune model retention --name N --samples 30d|off`): off unless turned on for
-- a model. With it on, the worker that commits a job's version keeps the job (its samples and parameters,
-- protobuf) beside it, sealed under the storage keys like the version's state, in the same transaction:
-- what a rebase onto a new base model replays. `attune model prune --samples` (a CronJob in Kubernetes)
-- deletes what is older than the period, and all of a model whose retention was turned off.
CREATE TABLE attune_model_settings (
    model            text PRIMARY KEY CHECK (model ~ '^[A-Za-z0-9_-]{1,128}$'),
    sample_retention interval CHECK (sample_retention > interval '0'),
    updated_at       timestamptz NOT NULL DEFAULT now()
);

-- One row per committed version whose job was kept; the key is the version's.
CREATE TABLE attune_retained_jobs (
    user_id      text        NOT NULL,
    model        text        NOT NULL,
    version      integer     NOT NULL,
    base_version integer     NOT NULL,
    job_id       text        NOT NULL UNIQUE,
    job_lo       lo          NOT NULL,
    size_bytes   integer     NOT NULL CHECK (size_bytes >= 0),
    samples      integer     NOT NULL CHECK (samples >= 0),
    retained_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, model, version)
);

CREATE INDEX attune_retained_jobs_age ON attune_retained_jobs (model, retained_at);

CREATE TRIGGER attune_retained_jobs_lo BEFORE UPDATE OR DELETE ON attune_retained_jobs
    FOR EACH ROW EXECUTE FUNCTION lo_manage(job_lo);
