-- Rebase (`attune model rebase --name N --base NEW.mlmodel`): every user of a model moves to a new base
-- version, their kept jobs replayed onto it in version order by the fleet, one ordinary job per user
-- (published to attune.jobs with the user's routing key, so it keeps its place among the user's own jobs).
-- One rebase per model runs at a time; re-running the command resumes it.
CREATE TABLE attune_rebases (
    id              bigserial   PRIMARY KEY,
    model           text        NOT NULL,
    base_version    integer     NOT NULL,
    -- What a user without kept jobs does: moves to the plain new base, or stays where it is.
    without_samples text        NOT NULL CHECK (without_samples IN ('move', 'stay')),
    state           text        NOT NULL DEFAULT 'running' CHECK (state IN ('running', 'done', 'cancelled')),
    reason          text,
    started_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz,
    FOREIGN KEY (model, base_version) REFERENCES attune_base_models (name, version)
);

CREATE UNIQUE INDEX attune_rebases_one_running ON attune_rebases (model) WHERE state = 'running';

-- One row per user the rebase moves, fixed when it starts. outcome NULL: still to come.
CREATE TABLE attune_rebase_users (
    rebase_id     bigint      NOT NULL REFERENCES attune_rebases (id) ON DELETE CASCADE,
    user_id       text        NOT NULL,
    from_version  integer     NOT NULL,
    from_base     integer     NOT NULL,
    kept_jobs     integer     NOT NULL CHECK (kept_jobs >= 0),
    job_id        text        NOT NULL UNIQUE,
    published_at  timestamptz,
    outcome       text        CHECK (outcome IN ('rebased', 'moved', 'stayed', 'failed', 'cancelled')),
    to_version    integer,
    reason        text,
    settled_at    timestamptz,
    PRIMARY KEY (rebase_id, user_id)
);

CREATE INDEX attune_rebase_users_open ON attune_rebase_users (rebase_id) WHERE outcome IS NULL;

-- History: a version a rebase made says where it came from (its base is the new one).
ALTER TABLE attune_personal_versions ADD COLUMN rebase_id bigint;
ALTER TABLE attune_personal_versions ADD COLUMN rebased_from integer;

-- Settles one user of a rebase, and the rebase itself once no user is left to come.
CREATE FUNCTION attune_settle_rebase_user(p_job_id text, p_outcome text, p_to_version integer, p_reason text)
RETURNS void LANGUAGE sql AS $$
    UPDATE attune_rebase_users SET outcome = p_outcome, to_version = p_to_version, reason = p_reason,
                                   settled_at = now()
    WHERE job_id = p_job_id AND outcome IS NULL;
    UPDATE attune_rebases r SET state = 'done', finished_at = now()
    WHERE r.state = 'running'
      AND r.id = (SELECT rebase_id FROM attune_rebase_users WHERE job_id = p_job_id)
      AND NOT EXISTS (SELECT 1 FROM attune_rebase_users u WHERE u.rebase_id = r.id AND u.outcome IS NULL);
$$;
