-- Forgetting a user (`attune user forget`), and erasure that holds for backups too.
--
-- attune_user_keys: one data key per user, wrapped (AES-256-GCM) by a master storage key of ATTUNE_KEYS,
-- the user id bound as associated data. With storage encryption on, a user's states and kept jobs are
-- sealed under the user's data key (envelope format 2), so deleting this row leaves every copy of those
-- objects (a dump, a backup, a replica's disk) unreadable, even to someone holding the master keys.
-- A backup that holds this table as well can still restore the user: back it up apart, with short retention.
CREATE TABLE attune_user_keys (
    user_id        text        PRIMARY KEY CHECK (user_id ~ '^[A-Za-z0-9_-]{1,128}$'),
    -- Names the data key in the envelopes it sealed: a key made again later is told from a destroyed one.
    key_id         text        NOT NULL CHECK (key_id ~ '^u[0-9a-f]{8}$'),
    -- The master key the data key is wrapped under; `attune keys rotate` wraps it again under the current one.
    master_key_id  text        NOT NULL,
    wrapped_key    bytea       NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now()
);

-- Tombstones of forgotten users: a SHA-256 of the user id, never the id, with the model forgotten ('' for
-- every model). A job of a forgotten user is dropped by the worker that gets it (its lookup reads this
-- table), whenever it was published: a job carries no publishing time to compare with, so a forgotten
-- user id stays forgotten.
CREATE TABLE attune_forgotten_users (
    user_sha256   bytea       NOT NULL CHECK (length(user_sha256) = 32),
    model         text        NOT NULL DEFAULT '',
    forgotten_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_sha256, model)
);

-- The last guard: a version of a forgotten user is refused at its insert, whatever path it comes by (a job
-- looked up before the forget and committed after it). SQLSTATE AT409 is what the batch commit reports as
-- "head moved": the worker looks the job up again, learns the user was forgotten, and drops it.
CREATE FUNCTION attune_refuse_forgotten() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM attune_forgotten_users f
               WHERE f.user_sha256 = sha256(convert_to(NEW.user_id, 'UTF8')) AND f.model IN ('', NEW.model)) THEN
        RAISE EXCEPTION 'user forgotten' USING ERRCODE = 'AT409';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER attune_personal_versions_forgotten BEFORE INSERT ON attune_personal_versions
    FOR EACH ROW EXECUTE FUNCTION attune_refuse_forgotten();
