-- The content digest of the job that produced each version (hex SHA-256 of the job's deterministic
-- protobuf form without its id). A job id seen again with another digest is refused rather than
-- taken for a redelivery. Nullable: versions committed before this migration have none, and their
-- job ids keep the old rule (any repeat is a duplicate).
ALTER TABLE attune_personal_versions
    ADD COLUMN job_digest text CHECK (job_digest ~ '^[0-9a-f]{64}$');
