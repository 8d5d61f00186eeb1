-- Attune's first schema: immutable base models, one head per user and model, and the line of
-- personal versions behind each head. Model bytes and update states are large objects.
--
-- The `lo` extension gives the `lo` column type and the `lo_manage` trigger, which unlinks a row's
-- large object when the row is deleted or its oid replaced, so the usual DELETE leaves no orphans.
-- (TRUNCATE and DROP fire no row triggers: clean up after them with vacuumlo.)
-- `lo` is a trusted extension since PostgreSQL 13, so the owner of the database can create it.
-- It goes into `public` so that every schema (tests use one per run) finds the same type.
CREATE EXTENSION IF NOT EXISTS lo SCHEMA public;

CREATE TABLE attune_base_models (
    name         text        NOT NULL CHECK (name ~ '^[A-Za-z0-9_-]{1,128}$'),
    version      integer     NOT NULL CHECK (version >= 1),
    -- What the model is, e.g. "neuralNetworkClassifier" or "kNearestNeighborsClassifier".
    kind         text        NOT NULL,
    model_lo     lo          NOT NULL,
    size_bytes   bigint      NOT NULL CHECK (size_bytes >= 0),
    sha256       text        NOT NULL,
    imported_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (name, version)
);

CREATE TRIGGER attune_base_models_lo BEFORE UPDATE OR DELETE ON attune_base_models
    FOR EACH ROW EXECUTE FUNCTION lo_manage(model_lo);

-- One row per user and model: the version an update task starts from. Version 0 is the base
-- itself. Writers lock this row (SELECT ... FOR UPDATE) to serialize commits for one user.
CREATE TABLE attune_personal_heads (
    user_id       text        NOT NULL CHECK (user_id ~ '^[A-Za-z0-9_-]{1,128}$'),
    model         text        NOT NULL,
    base_version  integer     NOT NULL,
    version       integer     NOT NULL CHECK (version >= 0),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, model),
    FOREIGN KEY (model, base_version) REFERENCES attune_base_models (name, version)
);

CREATE INDEX attune_personal_heads_base ON attune_personal_heads (model, base_version);

CREATE TABLE attune_personal_versions (
    user_id           text             NOT NULL,
    model             text             NOT NULL,
    version           integer          NOT NULL CHECK (version >= 1),
    base_version      integer          NOT NULL,
    parent_version    integer          NOT NULL CHECK (parent_version = version - 1),
    -- Chosen by the producer; a redelivered or re-published job is applied once.
    job_id            text             NOT NULL UNIQUE,
    state_lo          lo               NOT NULL,
    state_size_bytes  bigint           NOT NULL CHECK (state_size_bytes >= 0),
    loss              double precision,
    samples           integer          NOT NULL CHECK (samples >= 0),
    epochs            integer          NOT NULL CHECK (epochs >= 0),
    duration_seconds  double precision NOT NULL CHECK (duration_seconds >= 0),
    worker            text             NOT NULL,
    created_at        timestamptz      NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, model, version),
    FOREIGN KEY (model, base_version) REFERENCES attune_base_models (name, version)
);

CREATE TRIGGER attune_personal_versions_lo BEFORE UPDATE OR DELETE ON attune_personal_versions
    FOR EACH ROW EXECUTE FUNCTION lo_manage(state_lo);
