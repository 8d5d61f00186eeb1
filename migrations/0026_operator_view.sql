-- What the operators' page reads and writes (docs/operations.md#the-dashboard).
--
-- The newest outcomes first: the page's job table after a reload, and its throughput chart (completed jobs per
-- 5 s, counted from the rows written in the last minutes). A btree on a timestamp written in increasing order
-- only ever grows at its right edge, the cheapest index a commit can maintain.
CREATE INDEX IF NOT EXISTS attune_job_outcomes_updated ON attune_job_outcomes (updated_at);

-- Every action an operator took on jobs (replay or purge dead letters, cancel a job), from the dashboard or the
-- CLI, with the operator's name: the dashboard's basic-auth user, or the CLI's ATTUNE_OPERATOR (else the login
-- name). `target` says what was asked (a job id, a filter), never a sample.
CREATE TABLE IF NOT EXISTS attune_operator_actions (
    id        bigserial   PRIMARY KEY,
    at        timestamptz NOT NULL DEFAULT now(),
    operator  text        NOT NULL,
    source    text        NOT NULL CHECK (source IN ('dashboard', 'cli')),
    action    text        NOT NULL,
    target    text        NOT NULL,
    affected  integer     NOT NULL CHECK (affected >= 0)
);
CREATE INDEX IF NOT EXISTS attune_operator_actions_at ON attune_operator_actions (at);
