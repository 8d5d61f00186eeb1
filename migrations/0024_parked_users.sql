-- Users whose later jobs a partition's holder moved to the partition's parked queue (`attune.jobs.pNN.parked`),
-- so that a user with a backlog does not hold up the other users of the partition (docs/partitions.md).
-- Written before the first copy is published and deleted once every parked job of the user was taken back and
-- settled, so a row left behind (its holder died) tells the next holder to keep that user's new jobs behind the
-- parked ones until the parked queue is empty. The user is kept as the SHA-256 of the routing key, never the id.
CREATE TABLE attune_parked_users (
    generation integer     NOT NULL,
    partition  integer     NOT NULL,
    user_key   bytea       NOT NULL CHECK (length(user_key) = 32),
    worker     text        NOT NULL,
    parked_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (generation, partition, user_key)
);
