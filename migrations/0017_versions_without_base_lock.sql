-- Every version's insert checked its base model through a foreign key, and a foreign key check takes a
-- KEY SHARE lock on the referenced row: all of a model's versions lock its one base-model row. Two slots
-- committing at once make PostgreSQL record both lockers as a multixact, one per overlapping commit, and
-- every later read of that row resolves them (GetMultiXactIdMembers took a quarter of the backends' CPU).
-- Under a synchronous standby each commit lasts longer, so commits overlap more: the fleet ran at a third
-- of its rate through the HA set (deploy/bench.sh --ha: 450 jobs/s, 1,350 without the key). A version's base
-- is its head's, which the head's own foreign key keeps (checked when the line starts, not at every
-- commit); Attune never deletes a base model, and the trigger below refuses it while a version names one.
ALTER TABLE attune_personal_versions DROP CONSTRAINT attune_personal_versions_model_base_version_fkey;

CREATE FUNCTION attune_base_model_in_use() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM attune_personal_versions WHERE model = OLD.name AND base_version = OLD.version) THEN
        RAISE EXCEPTION 'base model %@% has personal versions', OLD.name, OLD.version
            USING ERRCODE = 'foreign_key_violation',
                  HINT = 'personal versions keep their records (pruning deletes only states): keep the base model';
    END IF;
    RETURN OLD;
END
$$;

CREATE TRIGGER attune_base_model_in_use BEFORE DELETE ON attune_base_models
    FOR EACH ROW EXECUTE FUNCTION attune_base_model_in_use();
