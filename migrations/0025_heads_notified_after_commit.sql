-- A head's notification (`attune_delivery`, read by `attune serve`'s cache) may be sent by the session that moved the
-- head once its commit has returned, instead of from inside the commit. PostgreSQL serializes every transaction that
-- notifies, from just before its commit until the commit has ended, WAL flush and synchronous standby included: with
-- the notification inside, the workers' commits could never overlap. A session that sets
-- `attune.heads_notified_after_commit` to `on` promises to call attune_notify_heads after each commit that moved
-- heads (the worker does); every other session (the CLI's rebase, forget, hold release) still notifies inside its
-- commit, as before.
CREATE OR REPLACE FUNCTION attune_notify_head() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('attune.heads_notified_after_commit', true) = 'on' THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('attune_delivery', OLD.model || '/' || OLD.user_id);
    ELSE
        PERFORM pg_notify('attune_delivery', NEW.model || '/' || NEW.user_id);
    END IF;
    RETURN NULL;
END $$;

-- The notifications of heads a committed transaction moved ("model/user" each), in a transaction of their own that
-- waits for no flush: a notification is delivered when this commits, and needs no durability.
CREATE FUNCTION attune_notify_heads(payloads text[]) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM pg_notify('attune_delivery', payload) FROM unnest(payloads) AS payload;
END $$;
