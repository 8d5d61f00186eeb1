-- The privacy ledger of `attune model learn-base` (issue 52): a next base learned from users' personal
-- versions under user-level differential privacy. An operator sets a model's budget; every run reserves its
-- (ε, δ) against it before it reads any user's data, and the spend stays on the ledger whatever becomes of
-- the run. Expand-only: new tables, nothing an older release reads changes.
--
-- How spends compose (ModelRegistry+PrivacyLedger.swift): basic composition, the sum of ε and the sum of δ
-- over every spend of the model. The per-order Rényi DP of a run is kept when the accountant gives it, so a
-- tighter composition can be computed later; the budget check does not use it.

-- A model's budget, one row per change: the newest row of a model is its budget, the rows before it say who
-- set what, when. No row: learn-base refuses to run (secure by default: an operator must choose a budget).
CREATE TABLE attune_privacy_budgets (
    id       bigserial        PRIMARY KEY,
    model    text             NOT NULL CHECK (model ~ '^[A-Za-z0-9_-]{1,128}$'),
    epsilon  double precision NOT NULL CHECK (epsilon > 0 AND epsilon < 'infinity'),
    -- The δ all runs together may spend (basic composition sums them).
    delta    double precision NOT NULL CHECK (delta > 0 AND delta < 1),
    set_by   text             NOT NULL,
    set_at   timestamptz      NOT NULL DEFAULT now()
);

CREATE INDEX attune_privacy_budgets_model ON attune_privacy_budgets (model, id);

-- One row per learn-base run: reserved before the run reads anything, then completed (with the candidate
-- base version it produced) or failed. Every state counts against the budget: a run that failed half way may
-- already have let something out (a log line, a file), and nothing can show it did not. The ledger never
-- names a user; it keeps counts.
CREATE TABLE attune_privacy_spends (
    id                   bigserial        PRIMARY KEY,
    model                text             NOT NULL,
    -- The base the users' changes were taken against: the users counted are those on it.
    from_base_version    integer          NOT NULL,
    -- The candidate base the run imported; NULL while reserved and for a failed run. A candidate exists as
    -- an ordinary base version before the quality gate and a rebase deliver it: the spend counts from the
    -- reservation on, released or not.
    base_version         integer,
    state                text             NOT NULL DEFAULT 'reserved' CHECK (state IN ('reserved', 'completed', 'failed')),
    epsilon              double precision NOT NULL CHECK (epsilon > 0 AND epsilon < 'infinity'),
    delta                double precision NOT NULL CHECK (delta > 0 AND delta < 1),
    -- q: each eligible user is sampled with this probability in each round.
    sample_rate          double precision NOT NULL CHECK (sample_rate > 0 AND sample_rate <= 1),
    -- z: the noise's standard deviation is z·S.
    noise_multiplier     double precision NOT NULL CHECK (noise_multiplier > 0 AND noise_multiplier < 'infinity'),
    -- S: each user's change is clipped to this L2 norm (flat) or split across layers (per_layer).
    clip_norm            double precision NOT NULL CHECK (clip_norm > 0 AND clip_norm < 'infinity'),
    clipping             text             NOT NULL CHECK (clipping IN ('flat', 'per_layer')),
    rounds               integer          NOT NULL CHECK (rounds >= 1),
    server_learning_rate double precision CHECK (server_learning_rate > 0 AND server_learning_rate < 'infinity'),
    -- N, counted in the reserving transaction. This row's δ ≤ 1/N is checked below; that the model's δ
    -- summed over all its runs stays ≤ 1/N is the Swift API's to check (a row's constraint sees no other
    -- row), and a budget's δ cannot be checked against the N of runs to come at all.
    eligible_users       integer          NOT NULL CHECK (eligible_users >= 1),
    -- Users sampled in each round, known once the run ends.
    sampled_per_round    integer[]        CHECK (array_length(sampled_per_round, 1) = rounds
                                                 AND array_position(sampled_per_round, NULL) IS NULL
                                                 AND 0 <= ALL (sampled_per_round) AND eligible_users >= ALL (sampled_per_round)),
    -- A seeded run draws its samples and noise from a seed: reproducible, so it promises no privacy at all.
    seeded               boolean          NOT NULL DEFAULT false,
    -- The run's Rényi DP at each order, when the accountant gave it (both or neither, of one length).
    rdp_orders           double precision[],
    rdp_epsilons         double precision[],
    reserved_by          text             NOT NULL,
    reserved_at          timestamptz      NOT NULL DEFAULT now(),
    finished_at          timestamptz,
    failure              text,
    CONSTRAINT attune_privacy_spends_delta_one_over_n CHECK (delta <= 1.0::float8 / eligible_users),
    CHECK ((rdp_orders IS NULL) = (rdp_epsilons IS NULL)
           AND array_length(rdp_orders, 1) IS NOT DISTINCT FROM array_length(rdp_epsilons, 1)),
    CHECK ((state = 'reserved') = (finished_at IS NULL)),
    CHECK ((state = 'completed') = (base_version IS NOT NULL)),
    CHECK (base_version > from_base_version),
    FOREIGN KEY (model, from_base_version) REFERENCES attune_base_models (name, version),
    FOREIGN KEY (model, base_version) REFERENCES attune_base_models (name, version),
    -- A base is learned by one run.
    UNIQUE (model, base_version)
);

CREATE INDEX attune_privacy_spends_model ON attune_privacy_spends (model, id);

-- Users who opted out of learn-base (`ModelRegistry.setExcludedFromLearning`): for one model, or for every
-- model (''). Kept as the SHA-256 of the user id, as the tombstones of forgotten users are, so a user who is
-- forgotten later leaves no id behind here. Their personal models train and are delivered as before; only
-- the fleet's learning of a next base leaves them out.
CREATE TABLE attune_learning_opt_outs (
    user_sha256   bytea       NOT NULL CHECK (length(user_sha256) = 32),
    model         text        NOT NULL DEFAULT '',
    opted_out_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_sha256, model)
);
