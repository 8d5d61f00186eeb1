-- Per-user device tokens (attune serve): an application's backend, which knows who its user is, signs
-- short-lived JWTs (EdDSA, Ed25519) bound to one user with a key attune issued to that application. Only
-- the public half is stored: a copy of this table lets nobody mint a token. A rotated-out key keeps
-- verifying the tokens it signed until retires_at (the grace window), and none after.
CREATE TABLE attune_application_keys (
    kid          text        PRIMARY KEY CHECK (kid ~ '^[0-9a-f]{16}$'),
    application  text        NOT NULL REFERENCES attune_applications (name) ON DELETE CASCADE,
    public_key   bytea       NOT NULL CHECK (length(public_key) = 32),
    created_at   timestamptz NOT NULL DEFAULT now(),
    retires_at   timestamptz
);

CREATE INDEX attune_application_keys_application ON attune_application_keys (application);

-- attune serve caches heads and keys in memory; these notifications tell it what changed, on commit (a
-- rolled-back transaction notifies nobody). The payload is "model/user" for one user's head, "*" when a
-- deployment changes (any device's base may move), "keys" when device keys change.
CREATE FUNCTION attune_notify_head() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('attune_delivery', OLD.model || '/' || OLD.user_id);
    ELSE
        PERFORM pg_notify('attune_delivery', NEW.model || '/' || NEW.user_id);
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER attune_personal_heads_notify AFTER INSERT OR UPDATE OR DELETE ON attune_personal_heads
    FOR EACH ROW EXECUTE FUNCTION attune_notify_head();

CREATE FUNCTION attune_notify_all() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('attune_delivery', TG_ARGV[0]);
    RETURN NULL;
END $$;

CREATE TRIGGER attune_deployments_notify AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON attune_deployments
    FOR EACH STATEMENT EXECUTE FUNCTION attune_notify_all('*');
CREATE TRIGGER attune_application_keys_notify AFTER INSERT OR UPDATE OR DELETE ON attune_application_keys
    FOR EACH STATEMENT EXECUTE FUNCTION attune_notify_all('keys');
CREATE TRIGGER attune_application_models_notify AFTER INSERT OR UPDATE OR DELETE ON attune_application_models
    FOR EACH STATEMENT EXECUTE FUNCTION attune_notify_all('keys');
-- A new base changes what devices get while no deployment names one (the newest base is served then).
CREATE TRIGGER attune_base_models_notify AFTER INSERT OR DELETE ON attune_base_models
    FOR EACH STATEMENT EXECUTE FUNCTION attune_notify_all('*');
CREATE TRIGGER attune_application_tokens_notify AFTER INSERT OR UPDATE OR DELETE ON attune_application_tokens
    FOR EACH STATEMENT EXECUTE FUNCTION attune_notify_all('keys');
