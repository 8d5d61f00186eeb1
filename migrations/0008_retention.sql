-- Retention and rollback (attune model prune / rollback).
--
-- A pruned version keeps its row and loses its state: the row's job id still makes a late redelivery of
-- that job a duplicate (exactly-once outlives pruning), and history still shows the line. Setting state_lo
-- to NULL fires the lo_manage trigger, which unlinks the large object, so nothing is left for vacuumlo.
ALTER TABLE attune_personal_versions ALTER COLUMN state_lo DROP NOT NULL;
ALTER TABLE attune_personal_versions ADD COLUMN pruned_at timestamptz;
ALTER TABLE attune_personal_versions ADD CONSTRAINT attune_personal_versions_state_or_pruned
    CHECK ((state_lo IS NULL) = (pruned_at IS NOT NULL));

-- A rollback appends a version whose state is a copy of an earlier one's, so history stays append-only
-- and version numbers are never reused (workers' memory of the heads they wrote relies on that).
ALTER TABLE attune_personal_versions ADD COLUMN restored_from integer
    CHECK (restored_from IS NULL OR (restored_from >= 1 AND restored_from < version));
