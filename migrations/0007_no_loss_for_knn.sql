-- A k-nearest-neighbours update (alone or at the end of a pipeline) appends samples and minimizes
-- nothing, so its versions have no loss. Workers before this migration stored the fraction of the job's
-- samples the previous version predicted wrongly in `loss`, which `attune model history` showed as if it
-- were one (1.0000 for a label the model had never seen). New versions store NULL; this clears the old.
-- Only `loss` changes: the state, job id and digest of every version stay as they were.
UPDATE attune_personal_versions v
SET loss = NULL
FROM attune_base_models b
WHERE b.name = v.model AND b.version = v.base_version AND v.loss IS NOT NULL
  AND (b.kind = 'kNearestNeighborsClassifier' OR b.kind LIKE 'pipeline%');
