"""The fleet bench's PostgreSQL side (psycopg): connections, the peer's and pgbench's own copies of Attune's
tables, resetting between scenarios, pgbench's rate for the commit transaction, and the base weights the
peer starts from."""
import contextlib
import hashlib
import os
import re
import subprocess
import urllib.parse
from pathlib import Path

import numpy as np
import psycopg

from bench_broker import purge_queues
from bench_common import CELERY_SCHEMA, HERE, PEER_SCHEMA, PGBENCH_SCHEMA, ROOT, log


def db_connect(args, schema=None):
    options = f"-c search_path={schema},public" if schema else None
    return psycopg.connect(args.database_url, autocommit=True, options=options)


def create_schema_copy(args, schema):
    """Attune's migrations run into `schema`, with the same base model row, so the peer never touches Attune's."""
    with db_connect(args) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        conn.execute(f"CREATE SCHEMA {schema}")
    with db_connect(args, schema) as conn:
        for sql in sorted((ROOT / "migrations").glob("*.sql")):
            conn.execute(sql.read_text())
    add_base_model(args, schema, "digits", args.model)


def add_base_model(args, schema, name, path):
    """Base model `name`, version 1, the .mlmodel at `path`, in `schema`'s copy of the tables (the rows the
    peer's versions refer to; Attune's own come from `attune model import`)."""
    model = Path(path).read_bytes()
    with db_connect(args, schema) as conn:
        conn.execute("INSERT INTO attune_base_models (name, version, kind, model_lo, size_bytes, sha256) "
                     "VALUES (%s, 1, 'neuralNetworkClassifier', lo_from_bytea(0, %s), %s, %s)",
                     (name, model, len(model), hashlib.sha256(model).hexdigest()))


# Every fleet's tables keep a history of earlier versions across scenarios, as a production database does. A
# table emptied before each run made the planner's choices those of a new fleet's first minute: a statement
# PL/pgSQL or a driver prepared while the versions table was empty kept a plan that scans it whole, and by
# 6,000 jobs each lookup by job id took 0.3-0.6 ms (the peer's as well as Attune's; see docs/benchmarks.md).
HISTORY_ROWS = 50_000
HISTORY_JOBS = "history-job-%"


def keep_history(conn):
    """HISTORY_ROWS versions of 5,000 earlier users in the connection's schema (added once; each with a
    one-byte large object of its own), without the outbox and outcome rows their inserts' trigger writes
    (deleted in the same transaction, so no worker's relay ever sees them)."""
    have = conn.execute("SELECT count(*) FROM attune_personal_versions WHERE job_id LIKE %s",
                        (HISTORY_JOBS,)).fetchone()[0]
    if have >= HISTORY_ROWS:
        return
    with conn.transaction():
        conn.execute("INSERT INTO attune_personal_versions (user_id, model, version, base_version, parent_version, "
                     "job_id, state_lo, state_size_bytes, loss, samples, epochs, duration_seconds, worker) "
                     "SELECT 'history-' || (g %% 5000), 'digits', g / 5000 + 1, 1, g / 5000, 'history-job-' || g, "
                     "lo_from_bytea(0, '\\x00'::bytea), 1, 0.5, 20, 10, 0.001, 'history' "
                     "FROM generate_series(%s::int, %s::int) g", (have, HISTORY_ROWS - 1))
        conn.execute("DELETE FROM attune_outbox WHERE job_id LIKE %s", (HISTORY_JOBS,))
        conn.execute("DELETE FROM attune_job_outcomes WHERE job_id LIKE %s", (HISTORY_JOBS,))


def clear_versions(conn):
    """Every version and head but the history's (lo_manage unlinks the large objects), the history added if missing."""
    conn.execute("DELETE FROM attune_personal_versions WHERE job_id NOT LIKE %s", (HISTORY_JOBS,))
    conn.execute("DELETE FROM attune_personal_heads")
    keep_history(conn)


def reset(args, admin):
    """Empty the queues and delete every personal version and head but the history's."""
    if args.active_url != args.database_url:
        return reset_ha(args, admin)
    for schema in (None, PEER_SCHEMA, CELERY_SCHEMA):
        with db_connect(args, schema) as conn:
            if schema and not conn.execute("SELECT to_regclass(%s)", (f"{schema}.attune_personal_versions",)).fetchone()[0]:
                continue
            clear_versions(conn)
    # VACUUM as the superuser (over the session's trusted socket) so that pg_largeobject is cleaned too and
    # every scenario starts from tables of the same shape. Best effort: skipped if the socket is not there.
    try:
        port = urllib.parse.urlparse(args.database_url).port or 5432
        with psycopg.connect(host=str(args.servers.pg_socket), port=port, user="postgres", dbname="attune",
                             autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")
            # Write out what the deletes and the vacuum dirtied now, not in a checkpoint during the next run.
            conn.execute("CHECKPOINT")
    except psycopg.Error as error:
        log(f"VACUUM skipped: {error}")
    purge_queues(admin)


def version_summary(args, schema=None):
    """(versions, mean loss, min, max, mean state bytes) over the personal versions in `schema`'s tables: the
    loss is each job's last-epoch loss, the figure its `completed` event reports, so both workers' work can be
    compared after a run; the state is what each commit stored."""
    with db_connect(args, schema) as conn:
        return conn.execute("SELECT count(*), avg(loss), min(loss), max(loss), avg(state_size_bytes) "
                            "FROM attune_personal_versions WHERE job_id NOT LIKE %s", (HISTORY_JOBS,)).fetchone()


def reset_ha(args, admin):
    """`reset` on the HA set: its primary found through the multi-host URL, VACUUM as its trusted superuser."""
    with psycopg.connect(args.active_url, autocommit=True) as conn:
        clear_versions(conn)
    superuser = re.sub(r"//[^@/]*@", "//postgres@", args.active_url)
    with psycopg.connect(superuser, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
    # A checkpoint on each node, the standby's too (there it is a restartpoint): otherwise the standby flushes
    # what it replayed of the last run and the reset (spread over minutes by checkpoint_completion_target)
    # while the next run's commits wait for its WAL flushes on the same disk.
    hosts = urllib.parse.urlparse(superuser).netloc.split("@")[-1].split(",")
    for host in hosts:
        name, port = host.rsplit(":", 1)
        with psycopg.connect(host=name, port=port, user="postgres", dbname="attune", autocommit=True) as conn:
            conn.execute("CHECKPOINT")
    purge_queues(admin)


def run_pgbench(args, clients, seconds):
    url = urllib.parse.urlparse(args.database_url)
    env = dict(os.environ, PGPASSWORD=urllib.parse.unquote(url.password or ""),
               PGOPTIONS=f"-c search_path={PGBENCH_SCHEMA},public")
    with db_connect(args, PGBENCH_SCHEMA) as conn:
        conn.execute("DELETE FROM attune_personal_versions")
        conn.execute("DELETE FROM attune_personal_heads")
    out = subprocess.run(
        [args.pgbench, "-n", "-M", "prepared", "-f", str(HERE / "commit.pgbench"), "-c", str(clients),
         "-j", str(min(clients, 2)), "-T", str(seconds), "-h", url.hostname, "-p", str(url.port or 5432),
         "-U", urllib.parse.unquote(url.username), url.path.lstrip("/")],
        env=env, capture_output=True, text=True)
    match = re.search(r"tps = ([\d.]+) \(without initial connection time\)", out.stdout)
    if out.returncode != 0 or not match:
        log(f"pgbench with {clients} clients failed: {out.stderr.strip()[-500:]}")
        return None
    return float(match.group(1))


def extract_base(model_path, out):
    """The base weights and update parameters of the .mlmodel, read with coremltools' protobuf spec."""
    # Imported only here (it is slow), quietly: it reports on stdout the macOS-only parts it lacks on Linux.
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull), contextlib.redirect_stderr(devnull):
        import coremltools
    spec = coremltools.utils.load_spec(model_path)
    nn = spec.neuralNetworkClassifier
    dense = [layer.innerProduct for layer in nn.layers if layer.isUpdatable and layer.WhichOneof("layer") == "innerProduct"]
    # Any MLP of two updatable dense layers (the digits' 64-32-10, --only big's 784-128-10): the peer trains
    # in -> dense -> ReLU -> dense -> softmax with the shapes found here.
    assert len(dense) == 2, "expected an MLP of two updatable inner-product layers"
    weights = {}
    for (w, b), layer in zip((("w1", "b1"), ("w2", "b2")), dense):
        weights[w] = np.array(layer.weights.floatValue, np.float32).reshape(layer.outputChannels, layer.inputChannels)
        weights[b] = np.array(layer.bias.floatValue, np.float32)
    up = nn.updateParams
    sgd = up.optimizer.sgdOptimizer
    np.savez(out, **weights, labels=np.array(list(nn.stringClassLabels.vector)),
             epochs=up.epochs.defaultValue, learning_rate=sgd.learningRate.defaultValue,
             mini_batch_size=sgd.miniBatchSize.defaultValue, momentum=sgd.momentum.defaultValue,
             shuffle=up.shuffle.defaultValue, seed=up.seed.defaultValue)
