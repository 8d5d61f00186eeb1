-- The application's role and database, on a server scripts/postgres.sh or scripts/postgres-ha.sh set up
-- (run as a superuser through psql; safe to run again). The role owns its database, which is all
-- CREATE EXTENSION lo needs: lo is a trusted extension since PostgreSQL 13, so no superuser rights are
-- required. CREATEDB: a test that runs vacuumlo (which judges a whole database) makes a database of its own.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'attune') THEN
        CREATE ROLE attune LOGIN PASSWORD 'attune';
    END IF;
    ALTER ROLE attune CREATEDB;
END
$$;
SELECT 'CREATE DATABASE attune OWNER attune'
WHERE NOT EXISTS (SELECT 1 FROM pg_database WHERE datname = 'attune') \gexec
-- pg_autoctl creates the database itself, owned by the postgres role.
ALTER DATABASE attune OWNER TO attune;
