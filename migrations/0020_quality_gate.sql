-- A quality gate before delivery (`attune model gate`). A new version whose validation accuracy (from its
-- job's validation samples) is below the model's floor, or more than the allowed drop below the version
-- devices are given now, is committed as usual (the user's line trains on from it) but held: `serve` goes
-- on delivering the newest version not held, until `attune model release` or a later version that passes.
ALTER TABLE attune_model_settings
    ADD COLUMN gate_min_accuracy double precision CHECK (gate_min_accuracy BETWEEN 0 AND 1),
    ADD COLUMN gate_max_drop double precision CHECK (gate_max_drop BETWEEN 0 AND 1);

CREATE TABLE attune_held_versions (
    user_id     text        NOT NULL,
    model       text        NOT NULL,
    version     integer     NOT NULL,
    reason      text        NOT NULL,
    held_at     timestamptz NOT NULL DEFAULT now(),
    released_at timestamptz,
    PRIMARY KEY (user_id, model, version)
);

-- The version a device of `user_id` is given for `model`'s line: the newest one not held (0: the base).
CREATE FUNCTION attune_delivered_version(p_user text, p_model text, below integer DEFAULT NULL) RETURNS integer
LANGUAGE sql STABLE AS $$
    SELECT coalesce(max(v.version), 0) FROM attune_personal_versions v
    WHERE v.user_id = p_user AND v.model = p_model AND (below IS NULL OR v.version < below)
      AND NOT EXISTS (SELECT 1 FROM attune_held_versions h
                      WHERE h.user_id = v.user_id AND h.model = v.model AND h.version = v.version
                        AND h.released_at IS NULL)
$$;

-- Why version `new_version` must be held, or NULL: its validation accuracy against the model's gate.
-- A version without validation samples (no accuracy) passes: there is nothing to judge it by.
CREATE FUNCTION attune_gate_reason(p_model text, p_user text, new_version integer, validation jsonb) RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    floor_accuracy double precision;
    max_drop       double precision;
    accuracy       double precision := (validation ->> 'accuracy')::double precision;
    delivered      integer;
    delivered_accuracy double precision;
BEGIN
    SELECT s.gate_min_accuracy, s.gate_max_drop INTO floor_accuracy, max_drop
    FROM attune_model_settings s WHERE s.model = p_model;
    IF accuracy IS NULL OR (floor_accuracy IS NULL AND max_drop IS NULL) THEN
        RETURN NULL;
    END IF;
    IF floor_accuracy IS NOT NULL AND accuracy < floor_accuracy THEN
        RETURN format('validation accuracy %s is below the floor %s', trim_scale(round(accuracy::numeric, 4)), floor_accuracy);
    END IF;
    IF max_drop IS NOT NULL THEN
        delivered := attune_delivered_version(p_user, p_model, new_version);
        SELECT (v.validation ->> 'accuracy')::double precision INTO delivered_accuracy
        FROM attune_personal_versions v
        WHERE v.user_id = p_user AND v.model = p_model AND v.version = delivered;
        IF delivered_accuracy IS NOT NULL AND accuracy < delivered_accuracy - max_drop THEN
            RETURN format('validation accuracy %s is %s below version %s''s %s (at most %s allowed)',
                          trim_scale(round(accuracy::numeric, 4)), trim_scale(round((delivered_accuracy - accuracy)::numeric, 4)), delivered,
                          trim_scale(round(delivered_accuracy::numeric, 4)), max_drop);
        END IF;
    END IF;
    RETURN NULL;
END
$$;

-- A hold or a release changes what devices get: `serve`'s cache hears of it as of a head move (0015).
CREATE TRIGGER attune_held_versions_notify AFTER INSERT OR UPDATE OR DELETE ON attune_held_versions
    FOR EACH ROW EXECUTE FUNCTION attune_notify_head();
