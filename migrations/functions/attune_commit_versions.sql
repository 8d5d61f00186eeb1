-- attune_commit_versions: the batch commit every worker runs (ModelRegistry.commitVersions), the one home of
-- the commit's rules. Edit this file, not a migration: `attune migrate` (and every worker at start) runs it
-- again whenever its text changed (attune_schema_functions keeps each file's SHA-256), after the numbered
-- migrations, so the live function is always this text (MigratorTests checks the live body against it).
-- CREATE OR REPLACE cannot change the arguments or the result columns: a change of those goes in a numbered
-- migration that drops the function first, and this file is then applied after it.
--
-- History of the rules (the migrations that defined earlier versions): 0003 one transaction for a batch,
-- 0004 cancels, 0005 parameters, 0012 validation metrics, 0017 head rows locked by an update in place (no
-- multixacts: see that migration's comment). Since 0.40 (issue 51) a batch whose every element fits its line
-- commits set-based, in one subtransaction; the per-element path below is for a batch that does not.
--
-- Its plans are made once a session (the SET clauses below), not at every call. Otherwise PostgreSQL plans a
-- statement over the argument arrays again at each call while its estimate for one element beats the generic
-- plan's for a hundred: a commit of one job, the usual one below the fleet's peak, spent a quarter of the
-- function's time planning. Every table here is read by its key, for a batch of a few dozen elements at most,
-- so index lookups in nested loops are the right plan at any table size; sequential scans and hash and merge
-- joins are off so that a plan made while a table was small never scans the whole of it once it has grown.
-- Large-object pages are compressed with lz4 where the server has it (after the body): a state of float32
-- weights does not compress, and lz4 gives up on a page sooner than pglz.
CREATE OR REPLACE FUNCTION attune_commit_versions(
    job_users          text[],
    job_models         text[],
    job_base_versions  integer[],
    job_parents        integer[],
    job_ids            text[],
    job_states         bytea,
    job_state_lengths  integer[],
    job_losses         double precision[],
    job_samples        integer[],
    job_epochs         integer[],
    job_durations      double precision[],
    job_workers        text[],
    job_digests        text[],
    job_parameters     text[],
    job_validations    text[])
RETURNS TABLE (
    ordinal                    integer,
    outcome                    text,
    head_version               integer,
    head_base                  integer,
    detail                     text,
    existing_user_id           text,
    existing_model             text,
    existing_version           integer,
    existing_base_version      integer,
    existing_parent_version    integer,
    existing_job_id            text,
    existing_state_size_bytes  bigint,
    existing_loss              double precision,
    existing_samples           integer,
    existing_epochs            integer,
    existing_duration_seconds  double precision,
    existing_worker            text,
    existing_job_digest        text,
    existing_created_at        double precision)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
DECLARE
    n          integer := coalesce(array_length(job_users, 1), 0);
    line       record;
    line_base  integer;
    -- The head rows this call inserted, as parallel arrays of user ids and models.
    created_users  text[] := '{}';
    created_models text[] := '{}';
    -- Elements that did not commit, as parallel arrays of their line and the version they would have
    -- made: a later element of the line whose parent is that version was trained from them.
    broken_users    text[] := '{}';
    broken_models   text[] := '{}';
    broken_versions integer[] := '{}';
    state_from integer := 1;     -- where element i's state starts in job_states
    hv         integer;
    hb         integer;
    new_oid    oid;
    existing   attune_personal_versions%ROWTYPE;
    constraint_name text;
BEGIN
    IF coalesce(array_length(job_models, 1), 0) <> n OR coalesce(array_length(job_base_versions, 1), 0) <> n
       OR coalesce(array_length(job_parents, 1), 0) <> n OR coalesce(array_length(job_ids, 1), 0) <> n
       OR coalesce(array_length(job_state_lengths, 1), 0) <> n OR coalesce(array_length(job_losses, 1), 0) <> n
       OR coalesce(array_length(job_samples, 1), 0) <> n OR coalesce(array_length(job_epochs, 1), 0) <> n
       OR coalesce(array_length(job_durations, 1), 0) <> n OR coalesce(array_length(job_workers, 1), 0) <> n
       OR coalesce(array_length(job_digests, 1), 0) <> n OR coalesce(array_length(job_parameters, 1), 0) <> n
       OR coalesce(array_length(job_validations, 1), 0) <> n THEN
        RAISE EXCEPTION 'attune_commit_versions: the argument arrays differ in length' USING ERRCODE = '22023';
    END IF;
    IF (SELECT coalesce(sum(l), 0) FROM unnest(job_state_lengths) l) <> coalesce(octet_length(job_states), 0) THEN
        RAISE EXCEPTION 'attune_commit_versions: the state lengths do not add up to the states sent' USING ERRCODE = '22023';
    END IF;

    -- Lock every head row of the batch first, one line after another in one fixed order, so two
    -- batches sharing users wait for each other instead of deadlocking. The lock is an update in place
    -- (see the top of this file: FOR UPDATE here made a multixact at each element's own update). A line without a head row
    -- gets one here, at version 0, in the same order: an inserted row holds off other inserters
    -- like a lock. Its base is the first of the line's elements naming an existing base model, as
    -- if that element had come first; elements before it fail on the model anyway.
    FOR line IN
        SELECT e.u, e.m FROM unnest(job_users, job_models) AS e(u, m)
        GROUP BY e.u, e.m
        ORDER BY e.u COLLATE "C", e.m COLLATE "C"
    LOOP
        UPDATE attune_personal_heads h SET updated_at = h.updated_at WHERE h.user_id = line.u AND h.model = line.m;
        CONTINUE WHEN FOUND;
        -- A line without a head row: the first of its elements naming an existing base model.
        SELECT e.b INTO line_base
        FROM unnest(job_users, job_models, job_base_versions) WITH ORDINALITY AS e(u, m, b, ord)
        WHERE e.u = line.u AND e.m = line.m
          AND EXISTS (SELECT 1 FROM attune_base_models b WHERE b.name = e.m AND b.version = e.b)
        ORDER BY e.ord LIMIT 1;
        IF FOUND THEN
            BEGIN
                INSERT INTO attune_personal_heads (user_id, model, base_version, version)
                VALUES (line.u, line.m, line_base, 0) ON CONFLICT (user_id, model) DO NOTHING;
                IF FOUND THEN
                    created_users := created_users || line.u;
                    created_models := created_models || line.m;
                END IF;
            EXCEPTION WHEN integrity_constraint_violation THEN
                -- A value the table refuses (say, the user id); the element reports it below.
                NULL;
            END;
            UPDATE attune_personal_heads h SET updated_at = h.updated_at WHERE h.user_id = line.u AND h.model = line.m;
        END IF;
    END LOOP;

    -- The common batch, set-based: every element trained from its line's head (or from the element before it
    -- in the batch), on the head's base, its job neither cancelled nor applied before. Its versions go in with
    -- one statement and its heads move with another, in one subtransaction, where the path below spends a
    -- subtransaction and a dozen statements on each element. Anything else (a moved head, a cancel, a job
    -- applied before, a base switch, a value a table refuses) undoes this block, and the per-element path
    -- then says which element and why.
    BEGIN
        -- The cancels' lock (attune_cancel_job takes it too), in the batch's order as the path below takes it.
        PERFORM pg_advisory_xact_lock(417003, hashtext(e.id))
        FROM unnest(job_ids) WITH ORDINALITY AS e(id, ord) ORDER BY e.ord;
        IF EXISTS (SELECT 1 FROM attune_cancelled_jobs c WHERE c.job_id = ANY (job_ids)) THEN
            RAISE EXCEPTION 'a job of the batch is cancelled' USING ERRCODE = 'AT499';
        END IF;
        IF (SELECT count(*)
            FROM (SELECT e.u, e.m, e.b, e.p, row_number() OVER (PARTITION BY e.u, e.m ORDER BY e.ord) AS k
                  FROM unnest(job_users, job_models, job_base_versions, job_parents)
                       WITH ORDINALITY AS e(u, m, b, p, ord)) e
            WHERE (e.p - e.k + 1, e.b) = (SELECT h.version, h.base_version FROM attune_personal_heads h
                                          WHERE h.user_id = e.u AND h.model = e.m)) <> n THEN
            RAISE EXCEPTION 'an element does not fit its head' USING ERRCODE = 'AT499';
        END IF;
        INSERT INTO attune_personal_versions
            (user_id, model, version, base_version, parent_version, job_id, state_lo, state_size_bytes, loss,
             samples, epochs, duration_seconds, worker, job_digest, parameters, validation)
        SELECT e.u, e.m, e.p + 1, e.b, e.p, e.id,
               lo_from_bytea(0, substring(job_states FROM (e.ends - e.len + 1)::integer FOR e.len)), e.len,
               e.loss, e.samples, e.epochs, e.duration, e.worker, e.digest, nullif(e.parameters, '')::jsonb,
               nullif(e.validation, '')::jsonb
        FROM (SELECT e.*, sum(e.len) OVER (ORDER BY e.ord) AS ends
              FROM unnest(job_users, job_models, job_base_versions, job_parents, job_ids, job_state_lengths,
                          job_losses, job_samples, job_epochs, job_durations, job_workers, job_digests,
                          job_parameters, job_validations)
                   WITH ORDINALITY AS e(u, m, b, p, id, len, loss, samples, epochs, duration, worker, digest,
                                        parameters, validation, ord)) e
        ORDER BY e.ord;
        UPDATE attune_personal_heads h SET version = l.v, updated_at = now()
        FROM (SELECT e.u, e.m, max(e.p) + 1 AS v FROM unnest(job_users, job_models, job_parents) AS e(u, m, p)
              GROUP BY e.u, e.m) l
        WHERE h.user_id = l.u AND h.model = l.m;
        RETURN QUERY
            SELECT e.ord::integer, 'committed'::text, e.p + 1, NULL::integer, NULL::text, NULL::text, NULL::text,
                   NULL::integer, NULL::integer, NULL::integer, NULL::text, NULL::bigint, NULL::double precision,
                   NULL::integer, NULL::integer, NULL::double precision, NULL::text, NULL::text,
                   NULL::double precision
            FROM unnest(job_parents) WITH ORDINALITY AS e(p, ord) ORDER BY e.ord;
        RETURN;
    EXCEPTION WHEN OTHERS THEN
        -- Undone, locks and large objects included: the per-element path decides each element.
        NULL;
    END;

    FOR i IN 1 .. n LOOP
        outcome := NULL; head_version := NULL; head_base := NULL; detail := NULL; existing := NULL;
        -- Each element is a subtransaction: its failure undoes its own work and nothing else's.
        BEGIN
            -- A cancel and a commit of one job id take turns (attune_cancel_job takes the same lock), so
            -- a job is either cancelled or committed, never both.
            PERFORM pg_advisory_xact_lock(417003, hashtext(job_ids[i]));
            IF EXISTS (SELECT 1 FROM attune_cancelled_jobs c WHERE c.job_id = job_ids[i]) THEN
                RAISE EXCEPTION 'job cancelled' USING ERRCODE = 'AT410';
            END IF;
            SELECT h.version, h.base_version INTO hv, hb
            FROM attune_personal_heads h WHERE h.user_id = job_users[i] AND h.model = job_models[i];
            IF NOT FOUND THEN
                -- No element of this line names an existing base model: this fails on the foreign
                -- key, unless the model was imported since the lines were locked.
                INSERT INTO attune_personal_heads (user_id, model, base_version, version)
                VALUES (job_users[i], job_models[i], job_base_versions[i], 0) ON CONFLICT (user_id, model) DO NOTHING;
                IF FOUND THEN
                    created_users := created_users || job_users[i];
                    created_models := created_models || job_models[i];
                END IF;
                SELECT h.version, h.base_version INTO hv, hb
                FROM attune_personal_heads h WHERE h.user_id = job_users[i] AND h.model = job_models[i] FOR UPDATE;
            END IF;

            -- A user's later job in a batch was trained from the earlier one's result. If the earlier one
            -- did not commit, the later one must not land on whatever head is there now, even one with the
            -- version number it expects: the worker trains it again from the real head.
            IF EXISTS (SELECT 1 FROM unnest(broken_users, broken_models, broken_versions) AS b(u, m, v)
                       WHERE b.u = job_users[i] AND b.m = job_models[i] AND b.v = job_parents[i]) THEN
                RAISE EXCEPTION 'an earlier element of this line did not commit' USING ERRCODE = 'AT409';
            END IF;
            -- A job trained from the head as it stands is new, unless it was applied on another line, which
            -- the insert's unique index says (unique_violation, below). Only an element the head does not
            -- fit is looked up first, so that an applied job reads as a duplicate and not as a moved head.
            -- Why not look every job up: PL/pgSQL keeps a statement's plan for the session, and one planned
            -- while the table was small (a new fleet's first minute) scans the whole table until the next
            -- ANALYZE: 0.59 ms a job by the time 6,000 jobs had drained into an empty table.
            IF hv <> job_parents[i] OR (hb <> job_base_versions[i] AND hv <> 0) THEN
                SELECT * INTO existing FROM attune_personal_versions v WHERE v.job_id = job_ids[i];
            END IF;
            IF existing.job_id IS NOT NULL THEN
                outcome := 'duplicate';
            ELSIF hb <> job_base_versions[i] AND hv <> 0 THEN
                outcome := 'base_mismatch';
                head_base := hb;
            ELSE
                IF hb <> job_base_versions[i] THEN
                    -- Nothing is stored at version 0, so the user may start from another base.
                    UPDATE attune_personal_heads h SET base_version = job_base_versions[i]
                    WHERE h.user_id = job_users[i] AND h.model = job_models[i];
                END IF;
                IF hv <> job_parents[i] THEN
                    -- Undo the base switch too: a refused element leaves nothing behind.
                    RAISE EXCEPTION 'head moved' USING ERRCODE = 'AT409';
                END IF;
                new_oid := lo_from_bytea(0, substring(job_states FROM state_from FOR job_state_lengths[i]));
                INSERT INTO attune_personal_versions
                    (user_id, model, version, base_version, parent_version, job_id, state_lo,
                     state_size_bytes, loss, samples, epochs, duration_seconds, worker, job_digest, parameters,
                     validation)
                VALUES (job_users[i], job_models[i], hv + 1, job_base_versions[i], job_parents[i], job_ids[i],
                        new_oid, job_state_lengths[i], job_losses[i], job_samples[i], job_epochs[i],
                        job_durations[i], job_workers[i], job_digests[i], nullif(job_parameters[i], '')::jsonb,
                        nullif(job_validations[i], '')::jsonb);
                UPDATE attune_personal_heads h SET version = hv + 1, updated_at = now()
                WHERE h.user_id = job_users[i] AND h.model = job_models[i];
                outcome := 'committed';
                head_version := hv + 1;
            END IF;
        EXCEPTION
            WHEN SQLSTATE 'AT410' THEN
                outcome := 'cancelled';
            WHEN SQLSTATE 'AT409' THEN
                outcome := 'head_moved';
                head_version := hv;
            WHEN foreign_key_violation THEN
                outcome := 'unknown_model';
            WHEN unique_violation THEN
                GET STACKED DIAGNOSTICS constraint_name = CONSTRAINT_NAME;
                IF constraint_name NOT LIKE '%job_id_key' THEN
                    RAISE;
                END IF;
                -- Another transaction committed the same job id (for another user or model) while
                -- this one waited on it: the job is still applied once.
                SELECT * INTO existing FROM attune_personal_versions v WHERE v.job_id = job_ids[i];
                outcome := 'duplicate';
            WHEN integrity_constraint_violation THEN
                outcome := 'invalid';
                detail := SQLERRM;
        END;
        IF outcome IS DISTINCT FROM 'committed' THEN
            broken_users := broken_users || job_users[i];
            broken_models := broken_models || job_models[i];
            broken_versions := broken_versions || (job_parents[i] + 1);
        END IF;
        state_from := state_from + job_state_lengths[i];

        ordinal := i;
        existing_user_id := existing.user_id;
        existing_model := existing.model;
        existing_version := existing.version;
        existing_base_version := existing.base_version;
        existing_parent_version := existing.parent_version;
        existing_job_id := existing.job_id;
        existing_state_size_bytes := existing.state_size_bytes;
        existing_loss := existing.loss;
        existing_samples := existing.samples;
        existing_epochs := existing.epochs;
        existing_duration_seconds := existing.duration_seconds;
        existing_worker := existing.worker;
        existing_job_digest := existing.job_digest;
        existing_created_at := extract(epoch FROM existing.created_at);
        RETURN NEXT;
    END LOOP;

    -- A line whose elements were all refused keeps no head row, as a refused single commit rolls
    -- its row back: version 0 is the base itself, with or without a row.
    DELETE FROM attune_personal_heads h
    USING unnest(created_users, created_models) AS c(user_id, model)
    WHERE h.user_id = c.user_id AND h.model = c.model AND h.version = 0;
END
$$;

-- lz4 where this server was built with it (see the top of this file); without it, pglz as before.
DO $lz4$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_settings WHERE name = 'default_toast_compression' AND 'lz4' = ANY (enumvals)) THEN
        ALTER FUNCTION attune_commit_versions SET default_toast_compression = lz4;
    END IF;
END
$lz4$;
