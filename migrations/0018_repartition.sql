-- Repartitioning a running fleet (`attune topology repartition --partitions M`): a new generation of
-- partition queues takes the users' jobs while the workers drain the old generation's, and switch to the
-- new one only once every old partition has been found empty, so no user's job overtakes an older one.
ALTER TABLE attune_topology
    -- The generation producers' jobs go to now, with `partitions` queues.
    ADD COLUMN generation integer NOT NULL DEFAULT 0 CHECK (generation >= 0),
    -- The generation being drained, while a repartition is under way; workers take jobs only from it.
    ADD COLUMN draining_generation integer,
    ADD COLUMN draining_partitions integer CHECK (draining_partitions BETWEEN 1 AND 999),
    -- When the draining generation's queues stopped receiving jobs (unbound from the jobs exchange):
    -- a partition found empty before then could still fill up.
    ADD COLUMN draining_unbound_at timestamptz,
    -- A drained generation whose queues may still exist on the broker, until the repartition deletes them.
    ADD COLUMN retired_generation integer,
    ADD COLUMN retired_partitions integer,
    ADD CONSTRAINT attune_topology_draining_whole CHECK ((draining_generation IS NULL) = (draining_partitions IS NULL)),
    ADD CONSTRAINT attune_topology_retired_whole CHECK ((retired_generation IS NULL) = (retired_partitions IS NULL)),
    ADD CONSTRAINT attune_topology_draining_older CHECK (draining_generation < generation);

-- Old partitions found drained: empty, none of their jobs in hand or waiting in a retry queue, at two
-- looks a second apart, by the worker holding the partition.
CREATE TABLE attune_drained_partitions (
    generation integer NOT NULL,
    partition integer NOT NULL,
    worker text NOT NULL,
    drained_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (generation, partition)
);

-- When each partition lease was last taken and last let go of on purpose. A worker that takes a partition
-- whose last holder let go (all its jobs settled first) may find it drained at once; one whose last holder
-- lost its session instead waits until that holder's unacked jobs are surely back in the queue.
CREATE TABLE attune_partition_handoffs (
    lease_key   integer PRIMARY KEY,
    acquired_at timestamptz NOT NULL,
    released_at timestamptz
);
