-- How many job partitions the fleet runs on, kept where every worker and `attune topology` reads it, so
-- that all of them declare and consume the same partition queues. One row, written by
-- `attune topology declare --partitions N` or, with the default count, by the first worker to start.
CREATE TABLE attune_topology (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    partitions integer NOT NULL CHECK (partitions BETWEEN 1 AND 999),
    changed_at timestamptz NOT NULL DEFAULT now()
);

-- A deployment that used Attune before the count was kept here ran on the 16 partitions the code had then,
-- and its broker routes jobs to those 16 queues: it keeps them.
INSERT INTO attune_topology (partitions)
SELECT 16 WHERE EXISTS (SELECT 1 FROM attune_base_models) OR EXISTS (SELECT 1 FROM attune_personal_heads);
