-- Deployments and collections, as Core ML's Model Deployment has them.
--
-- A deployment says which base version a population of users gets: one row per (model, attribute, value),
-- the population of devices that send that attribute with that value; attribute '' is the model's default.
-- With a default, new users' lines start on its base instead of the newest import, so a new base version
-- reaches users only when a deployment names it.
CREATE TABLE attune_deployments (
    model         text        NOT NULL,
    attribute     text        NOT NULL DEFAULT '' CHECK (attribute ~ '^([A-Za-z0-9_-]{1,64})?$'),
    value         text        NOT NULL DEFAULT '',
    base_version  integer     NOT NULL,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (model, attribute, value),
    CHECK ((attribute = '') = (value = '')),
    FOREIGN KEY (model, base_version) REFERENCES attune_base_models (name, version)
);

-- Models released together: a device fetches a collection's manifest and gets every model in it.
CREATE TABLE attune_collections (
    name   text NOT NULL CHECK (name ~ '^[A-Za-z0-9_-]{1,128}$'),
    model  text NOT NULL,
    PRIMARY KEY (name, model)
);
