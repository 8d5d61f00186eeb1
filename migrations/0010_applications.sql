-- Applications and their bearer tokens, for model delivery (attune serve). A token belongs to one
-- application and sees only that application's models. Only a token's SHA-256 is stored: a token is 32
-- random bytes, so a fast hash is enough (no dictionary to guess from), and a stolen table gives no token.
CREATE TABLE attune_applications (
    name        text        PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9_-]{1,128}$'),
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE attune_application_models (
    application text NOT NULL REFERENCES attune_applications (name) ON DELETE CASCADE,
    model       text NOT NULL,
    PRIMARY KEY (application, model)
);

CREATE TABLE attune_application_tokens (
    -- The public half of a token (att_<id>_<secret>): how a token is found, listed and revoked.
    id             text        PRIMARY KEY CHECK (id ~ '^[0-9a-f]{12}$'),
    application    text        NOT NULL REFERENCES attune_applications (name) ON DELETE CASCADE,
    secret_sha256  bytea       NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    revoked_at     timestamptz
);
