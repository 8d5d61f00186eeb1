#!/usr/bin/env python3
"""The fault suite's logic: its arguments, its plan of faults, the waits between them, and every check after the
run. scripts/fault-suite.sh starts and kills the processes and calls this; the options are described there.

    fault-suite.py options WORK ARGS...         check the suite's arguments, keep them in WORK/options.json and
                                                print them as shell assignments, with the plan of faults
    fault-suite.py publish WORK PART PARTS      `attune audit record` for part PART (from 0) of PARTS of the jobs
    fault-suite.py await-leases WORK            until every worker started holds a partition (120 s at most)
    fault-suite.py await-step WORK VERSIONS ACTION DEADLINE
                                                until VERSIONS versions are committed; exit 1 when the run stalls
                                                (120 s without a commit) or passes DEADLINE (epoch seconds)
    fault-suite.py commits-while-down WORK      until a twentieth of the good jobs is committed, or 30 s; prints
                                                how many were
    fault-suite.py first-queue WORK             the current generation's first partition queue
    fault-suite.py terminate-backends WORK      one round of pg_terminate_backend on the workers' backends;
                                                prints how many were in a commit, busy otherwise, and idle
    fault-suite.py await-outbox WORK            until the outbox is empty (60 s at most)
    fault-suite.py tally WORK                   the faults done so far, in a line
    fault-suite.py report WORK                  every check after the run, and the counts; exit 1 on a violation

The servers' URLs come from ATTUNE_DATABASE_URL and ATTUNE_AMQP_URL. What the shell did, it writes to
WORK/faults.log, a line a fault (see `record` in fault-suite.sh), which `tally` and `report` read. The standard
library only, except `report`, which reads the durable events queue with pika.
"""
import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parent.parent
MODEL = "digits"
TERMINAL_QUEUE = "attune-fault-terminal"


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr, flush=True)


# ---- the arguments --------------------------------------------------------------------------------------------

class HA(argparse.Action):
    """--ha leaves out the faults that do not apply to a pg_auto_failover pair; a count given after it still counts."""

    def __call__(self, parser, namespace, values, option_string=None):
        namespace.ha = True
        namespace.pg_restarts = namespace.pg_crashes = namespace.pg_kills = 0


def parse_options(argv):
    class Parser(argparse.ArgumentParser):
        def error(self, message):
            print(f"fault-suite.sh: {message} (see the comment at the top)", file=sys.stderr)
            sys.exit(2)

    p = Parser(prog="fault-suite.sh", add_help=False, allow_abbrev=False)
    for name, default in [("jobs", 3000), ("users", 60), ("hot", 3), ("workers", 4), ("concurrency", 1),
                          ("kills", 8), ("sigterms", 3), ("bad", 15), ("republish", 30), ("scheduled", None),
                          ("samples", 100), ("epochs", None), ("timeout", 900), ("cluster", 0),
                          ("pg-terminates", 20), ("pg-restarts", 1), ("pg-crashes", 1), ("pg-kills", 1),
                          ("node-kills", 1), ("ha-kills", 1), ("ha-failovers", 1), ("partitions", None),
                          ("prefetch", None), ("repartition", None)]:
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--ha", nargs=0, action=HA, default=False)
    p.add_argument("--every-worker-commits", action="store_true")
    p.add_argument("--debug", action="store_true")
    p.add_argument("--keep", action="store_true")
    o = p.parse_args(argv)
    if o.repartition is not None and o.partitions is None:
        o.partitions = 16
    if o.scheduled is None:
        o.scheduled = o.jobs // 10
    o = vars(o)
    o["good"] = o["jobs"] - o["bad"]
    o["build"] = "debug" if o["debug"] else "release"
    o["attune"] = str(REPOSITORY / ".build" / o["build"] / "attune")
    o["plan"] = plan(o)
    return o


def plan(o):
    """Each fault as "VERSIONS ACTION": it fires once the number of versions passes its share of the good jobs."""
    good, steps = o["good"], []

    def spread(count, first, last, action):
        """`count` of `action`, evenly from `first` to `last` percent of the good jobs."""
        for i in range(count):
            steps.append(((first + i * (last - first) // (count - 1 if count > 1 else 1)) * good // 100, action))

    spread(o["kills"], 5, 85, "kill")
    spread(o["sigterms"], 15, 75, "term")
    spread(o["pg_terminates"], 8, 92, "pg-terminate")
    spread(o["pg_restarts"], 30, 45, "postgres")
    spread(o["pg_crashes"], 40, 60, "pg-crash-ha" if o["ha"] else "pg-crash")
    spread(o["pg_kills"], 65, 80, "pg-kill")
    steps.append((good * 55 // 100, "rabbitmq"))
    if o["ha"]:
        spread(o["ha_kills"], 25, 45, "ha-kill")
        spread(o["ha_failovers"], 60, 80, "ha-failover")
    if o["cluster"] > 0:
        spread(o["node_kills"], 70, 85, "node-kill")
    if o["repartition"] is not None:
        # A fifth of the good jobs is well inside the first half, so the old generation still holds jobs.
        steps.append((good * 20 // 100, "repartition"))
    return [f"{n} {action}" for n, action in sorted(steps)]


def options(work):
    return json.loads((Path(work) / "options.json").read_text())


def cmd_options(work, *argv):
    o = parse_options(list(argv))
    (Path(work) / "options.json").write_text(json.dumps(o, indent=1))
    shell = {k: "" if v is None else str(int(v) if isinstance(v, bool) else v)
             for k, v in o.items() if k not in ("plan", "debug")}
    for k, v in shell.items():
        print(f"{k}={shlex.quote(v)}")
    print("plan=(" + " ".join(shlex.quote(step) for step in o["plan"]) + ")")


# ---- the servers ----------------------------------------------------------------------------------------------

def psql(sql, *flags, check=True):
    """psql's unaligned, tuples-only output of `sql` on ATTUNE_DATABASE_URL."""
    result = subprocess.run(["psql", os.environ["ATTUNE_DATABASE_URL"], "-XAtq", *flags, "-c", sql],
                            capture_output=True, text=True)
    if check and result.returncode != 0:
        raise RuntimeError(f"psql: {result.stderr.strip()}")
    return result.stdout.strip() if result.returncode == 0 else None


def versions():
    """Committed versions; 0 while PostgreSQL is down."""
    return int(psql("SELECT count(*) FROM attune_personal_versions", check=False) or 0)


def attune(o, *args, **kwargs):
    return subprocess.run([o["attune"], *args], **kwargs)


# ---- during the run -------------------------------------------------------------------------------------------

def cmd_publish(work, part, parts):
    """The next 1/PARTS of the jobs, and of the bad, republished and scheduled ones, added to jobs.jsonl."""
    o, i, parts = options(work), int(part), int(parts)

    def share(n):
        return n * (i + 1) // parts - n * i // parts

    result = attune(o, "audit", "record", "--model", MODEL, "--jobs-file", f"{work}/jobs.jsonl",
                    "--csv", "examples/data/digits.csv.gz", *(["--append"] if i > 0 else []),
                    "--jobs", str(share(o["jobs"])), "--users", str(o["users"]), "--hot", str(o["hot"]),
                    "--samples-per-job", str(o["samples"]),
                    *(["--epochs", str(o["epochs"])] if o["epochs"] is not None else []),
                    "--bad", str(share(o["bad"])), "--republish", str(share(o["republish"])),
                    "--scheduled", str(share(o["scheduled"])), cwd=REPOSITORY)
    return result.returncode


def cmd_await_leases(work):
    """Until every worker started holds at least one partition: `attune audit leases` reads the leases through
    PartitionLeases, where their lock classes are defined."""
    o = options(work)
    holders = fewest = 0
    for _ in range(600):
        listing = attune(o, "audit", "leases", capture_output=True, text=True).stdout
        shares = [int(line.split()[2]) for line in listing.splitlines() if line.strip()]
        shares = [n for n in shares if n > 0]
        holders, fewest = len(shares), min(shares, default=0)
        if holders == o["workers"] and fewest >= 1:
            break
        time.sleep(0.2)
    print(f"{holders} workers hold partitions, each at least {fewest}")


def cmd_await_step(work, threshold, action, deadline):
    threshold, deadline = int(threshold), float(deadline)
    last, since = -1, time.time()
    while (now := versions()) < threshold:
        if now != last:
            last, since = now, time.time()
        if time.time() > deadline or time.time() - since > 120:
            fail(f"the run stalled at {now} versions, waiting for {threshold} to {action}")
            return 1
        time.sleep(0.3)
    return 0


def cmd_commits_while_down(work):
    """Not a check: a partition whose single active consumer was attached through the lost node waits until the
    node returns (RabbitMQ 3.10 keeps that consumer active while its node is unreachable), so when one worker on
    that node held every partition, nothing moves meanwhile (docs/operations.md: A RabbitMQ cluster)."""
    before, until = versions(), time.time() + 30
    while versions() < before + options(work)["good"] // 20 and time.time() < until:
        time.sleep(0.1)
    print(versions() - before)


def cmd_first_queue(work):
    generation = int(psql("SELECT generation FROM attune_topology"))
    print(f"attune.jobs.g{generation}.p00" if generation > 0 else "attune.jobs.p00")


# One round of pg_terminate_backend on every backend of the workers (application_name fault-*, from PGAPPNAME), in
# one statement on the server: it waits up to 5 s, looking every millisecond, for a worker's commit
# (attune_commit_versions, which writes the large objects and moves the heads) to be running, so that most rounds
# land inside a transaction. Returns how many backends were in a commit, busy otherwise, and idle; the statements
# themselves are only matched, never printed.
TERMINATE_WORKERS = """
CREATE FUNCTION pg_temp.terminate_workers(wait_s float8) RETURNS TABLE (in_commit int, busy int, idle int)
LANGUAGE plpgsql AS $$
DECLARE
    until timestamptz := clock_timestamp() + make_interval(secs => wait_s);
BEGIN
    LOOP
        PERFORM pg_stat_clear_snapshot();
        EXIT WHEN clock_timestamp() >= until OR EXISTS (
            SELECT 1 FROM pg_stat_activity
            WHERE application_name LIKE 'fault-%' AND state = 'active' AND query LIKE '%attune_commit_versions%');
        PERFORM pg_sleep(0.001);
    END LOOP;
    PERFORM pg_stat_clear_snapshot();
    RETURN QUERY
        SELECT count(*) FILTER (WHERE a.state = 'active' AND a.query LIKE '%attune_commit_versions%')::int,
               count(*) FILTER (WHERE a.state <> 'idle' AND NOT (a.state = 'active' AND a.query LIKE '%attune_commit_versions%'))::int,
               count(*) FILTER (WHERE a.state = 'idle')::int
        FROM pg_stat_activity a
        -- The workers' partition-lease sessions too (named attune-lease@<release>:<worker> for attune topology status).
        -- CASE fixes the order: the planner may run a cheaper qual first, and pg_terminate_backend on a
        -- superuser's session is an error.
        WHERE CASE WHEN (a.application_name LIKE 'fault-%' OR a.application_name LIKE 'attune-lease@%:fault-%')
                        AND a.pid <> pg_backend_pid()
                   THEN pg_terminate_backend(a.pid) ELSE false END;
END
$$;
SELECT * FROM pg_temp.terminate_workers(5);
"""


def cmd_terminate_backends(work):
    result = subprocess.run(["psql", os.environ["ATTUNE_DATABASE_URL"], "-XAtq", "-F", " ", "-v", "ON_ERROR_STOP=1"],
                            input=TERMINATE_WORKERS, capture_output=True, text=True)
    sys.stderr.write(result.stderr)
    print(result.stdout.strip())
    return result.returncode


def cmd_await_outbox(work):
    """The events a killed worker owed come from the survivors' outbox relays once 3 s old."""
    until = time.time() + 60
    while (outbox := psql("SELECT count(*) FROM attune_outbox", check=False)) != "0":
        if time.time() > until:
            fail(f"{outbox} terminal event(s) still in the outbox after 60 s")
            return 1
        time.sleep(0.5)
    return 0


# ---- what the shell did ---------------------------------------------------------------------------------------

class Faults:
    """WORK/faults.log read back: one line a fault or a moment, its kind first (see `record` in fault-suite.sh)."""

    def __init__(self, work):
        self.lines = [line.split() for line in (Path(work) / "faults.log").read_text().splitlines() if line.strip()]

    def all(self, kind):
        return [fields[1:] for fields in self.lines if fields[0] == kind]

    def count(self, kind):
        return len(self.all(kind))

    def moment(self, kind):
        return float(self.all(kind)[-1][0])

    def tally(self):
        rounds = self.all("pg-terminate")
        return {
            "killed": self.count("kill"), "terminated": self.count("term"), "stopped_at_end": self.count("stop"),
            "term_failures": self.count("term-failure"), "pg_terminate_rounds": len(rounds),
            "in_commit": sum(int(r[0]) for r in rounds), "busy": sum(int(r[1]) for r in rounds),
            "idle": sum(int(r[2]) for r in rounds), "pg_restarts": self.count("postgres"),
            "pg_crashes": self.count("pg-crash"), "pg_kills": self.count("pg-kill"),
            "amqp_restarts": self.count("rabbitmq"), "node_kills": self.count("node-kill"),
        }


def cmd_tally(work):
    t = Faults(work).tally()
    print(f"{t['killed']} killed, {t['terminated']} stopped; PostgreSQL: {t['pg_terminate_rounds']} termination rounds, "
          f"{t['pg_restarts']} restart(s), {t['pg_crashes']} crash(es), {t['pg_kills']} kill(s); "
          f"RabbitMQ: {t['amqp_restarts']} restart(s), {t['node_kills']} node kill(s)")


# ---- after the run --------------------------------------------------------------------------------------------

def section(title):
    print(f"== {title}", flush=True)


def check_audit(o, work):
    """`attune audit check`: every job ended exactly once, every user's model a replay of its jobs, no orphans."""
    section("audit")
    result = attune(o, "audit", "check", "--model", MODEL, "--jobs-file", f"{work}/jobs.jsonl",
                    stdout=subprocess.PIPE, text=True)
    print(result.stdout, end="", flush=True)
    (Path(work) / "audit.txt").write_text(result.stdout)
    return result.returncode == 0


def check_encryption(o, work):
    """Every large object under the current key (ATTUNE_KEYS)."""
    section("encryption at rest")
    result = attune(o, "keys", "status", stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    print(result.stdout, end="", flush=True)
    (Path(work) / "keys.txt").write_text(result.stdout)
    ok = result.returncode == 0
    if "everything is under the current key" not in result.stdout:
        fail("stored objects outside the current key (clear text or another key)")
        ok = False
    return ok


def check_completed_events(work):
    """Every job a worker reported completed (a `completed` event, published only after the commit) must have that
    version in the database now: a commit acknowledged and then lost in a crash would fail here."""
    section("completed events")
    listing = psql("SELECT job_id, user_id, model, version FROM attune_personal_versions", "-F", " ", check=False)
    ok = listing is not None
    (Path(work) / "versions.txt").write_text((listing or "") + "\n")
    stored = {}
    for line in (listing or "").splitlines():
        job, user, model, version = line.split()
        stored[job] = (user, model, int(version))
    reported = {}
    for event in events(work):
        if event.get("kind", "").endswith("COMPLETED"):
            reported.setdefault(event.get("jobId", ""), set()).add(
                (event.get("userId", ""), event.get("model", ""), int(event.get("version", "0"))))
    missing = sorted(job for job, versions in reported.items() if any(stored.get(job) != v for v in versions))
    print(f"completed events     {len(reported)} jobs reported completed, {len(reported) - len(missing)} of them stored as reported")
    if stored and not reported:
        fail("no completed event was recorded, so none could be checked (see watch.log)")
        return False
    if missing:
        shown = ", ".join(f"{job} (reported {sorted(reported[job])}, stored {stored.get(job)})" for job in missing[:10])
        fail(f"{len(missing)} job(s) reported completed are not in the database as reported: {shown}")
        return False
    return ok


def events(work):
    """The events `attune watch --json` printed during the run (a line cut by a kill is skipped)."""
    for line in (Path(work) / "events.jsonl").read_text(errors="replace").splitlines():
        try:
            yield json.loads(line)
        except ValueError:
            continue


def failover_stalls(faults):
    """The stall each failover caused the fleet: the longest pause between two consecutive committed versions
    (created_at, the database's clock, on this machine) that overlaps the failover, from the kill or the planned
    failover's start to when the URL took writes again, and that began at most 5 s before it (n/a: the fleet was not
    committing then). (The next version after the kill is no measure: commits of the old primary's last moments,
    replicated, come after the moment the kill began.)"""
    outages = [(fields[1], fields[2]) for fields in faults.lines if fields[0] in ("ha-kill", "ha-failover")]
    return [psql(f"""
        SELECT coalesce(round(max(extract(epoch FROM next - at))::numeric, 1)::text, 'n/a')
        FROM (SELECT created_at AS at, lead(created_at) OVER (ORDER BY created_at) AS next
              FROM attune_personal_versions) AS g
        WHERE next >= to_timestamp({t0}) AND at <= to_timestamp({t1})
          AND at >= to_timestamp({t0}) - interval '5 seconds'""", check=False) or "" for t0, t1 in outages]


def check_workers(o, work, faults):
    """Which of the started workers committed a version: with more workers than the old 16 partitions, each must
    get jobs of its own (--every-worker-commits); and with --repartition, the fleet on the new generation alone."""
    ok = True
    started = [fields[0] for fields in faults.all("start")]
    committing = int(psql(f"""SELECT count(DISTINCT worker) FROM attune_personal_versions
                              WHERE worker = ANY (string_to_array('{",".join(started)}', ','))"""))
    print(f"workers committing   {committing} of {len(started)} started ({psql('SELECT partitions FROM attune_topology')} partitions)")
    if o["repartition"] is not None:
        layout = psql("SELECT generation || ' ' || partitions || ' ' || (draining_generation IS NULL AND retired_generation IS NULL) "
                      "FROM attune_topology")
        drained = re.findall(r"drained in [0-9.]* s", (Path(work) / "repartition.log").read_text(errors="replace"))
        print(f"repartition          {o['partitions']} -> {o['repartition']}: generation, partitions, alone: {layout}; "
              f"{chr(10).join(drained) or 'not drained'}")
        if layout != f"1 {o['repartition']} true":
            fail(f"the fleet is not on generation 1 of {o['repartition']} partitions alone")
            ok = False
    if o["every_worker_commits"] and committing < len(started):
        fail(f"{len(started) - committing} worker(s) committed nothing")
        ok = False
    return ok


def check_outcomes(work):
    """Every job has one outcome in PostgreSQL (completed, or failed for the bad ones) and at least one terminal
    event in the durable queue; a second one for a job must say so (a duplicate, or republished from the outbox)."""
    import pika

    section("outcomes and terminal events")
    listing = psql("SELECT job_id, state FROM attune_job_outcomes", "-F", " ", check=False)
    (Path(work) / "outcomes.txt").write_text((listing or "") + "\n")
    expected = {}
    for line in (Path(work) / "jobs.jsonl").read_text().splitlines():
        job = json.loads(line)
        expected[job["jobId"]] = "failed" if "not-a-class" in line else "completed"
    outcomes = dict(line.split() for line in (listing or "").splitlines() if line.strip())
    wrong = {j: (want, outcomes.get(j, "none")) for j, want in expected.items() if outcomes.get(j) != want}
    print(f"outcomes             {len(expected) - len(wrong)} of {len(expected)} jobs with the outcome expected", flush=True)
    for j, (want, got) in list(wrong.items())[:10]:
        fail(f"job {j}: outcome {got}, expected {want}")
    connection = pika.BlockingConnection(pika.URLParameters(os.environ["ATTUNE_AMQP_URL"].split(";")[0]))
    channel = connection.channel()
    seen, plain, extras, unmarked, history = {}, {}, {"duplicate": 0, "republished": 0, "again": 0}, [], {}
    while True:
        method, properties, body = channel.basic_get(TERMINAL_QUEUE, auto_ack=True)
        if method is None:
            break
        event = json.loads(body)
        job = event.get("jobId", "")
        if event.get("kind") == "FAILED" and event.get("willRetry"):
            continue  # bound by the same key as the final failure, and not an end: the job comes back
        marker = (properties.headers or {}).get("x-attune-republished")
        republished = marker in ("true", b"true")
        history.setdefault(job, []).append(f"{event.get('kind')} by {event.get('worker')} v{event.get('version', 0)}"
                                           f"{' duplicate' if event.get('duplicate') else ''}{' republished' if republished else ''}"
                                           f" at {event.get('timestampMs')}")
        # The first copy in the queue may be a republished one (its worker's own publish came after the grace), so
        # what must hold is that at most one copy of a job's end is unmarked.
        if event.get("duplicate"):
            extras["duplicate"] += 1
        elif republished:
            extras["republished"] += 1
        elif job in plain:
            if event.get("kind") == "FAILED" and plain[job] == "FAILED":
                extras["again"] += 1  # a dead-letter copy unconfirmed when its worker died: refused again, the same reason
            else:
                unmarked.append(job)
        else:
            plain[job] = event.get("kind")
        seen.setdefault(job, event.get("kind"))
    connection.close()
    missing = [j for j in expected if j not in seen]
    print(f"terminal events      {len(expected) - len(missing)} of {len(expected)} jobs with one in the durable queue; marked copies: "
          f"{extras['duplicate']} duplicates, {extras['republished']} republished, {extras['again']} refused again, {len(unmarked)} unmarked",
          flush=True)
    for j in missing[:10]:
        fail(f"job {j} has no terminal event in the durable queue")
    for j in unmarked[:10]:
        fail(f"job {j} has a second terminal event that is neither a duplicate nor republished: {'; '.join(history[j])}")
    return listing is not None and not (wrong or missing or unmarked)


def print_faults(o, work, faults, stalls):
    """The faults the run went through, and what they cost; no check."""
    section("faults and events")
    retried = duplicates = requeued = 0
    for event in events(work):
        kind = event.get("kind", "")
        if kind.endswith("FAILED") and event.get("willRetry"):
            retried += 1
            if "shut down before the job finished" in event.get("reason", ""):
                requeued += 1
        if kind.endswith("COMPLETED") and event.get("duplicate"):
            duplicates += 1
    print(f"retried              {retried} (failed with will_retry; {requeued} of them requeued at shutdown)")
    print(f"duplicates prevented {duplicates} (completed with duplicate; events missed while RabbitMQ was down are not counted)")
    t = faults.tally()
    print(f"workers killed       {t['killed']} (SIGKILL)")
    print(f"workers stopped      {t['terminated']} by SIGTERM mid-run, {t['stopped_at_end']} at the end; non-zero exits: {t['term_failures']}")
    exits = sorted(float(exited) - float(sent) for _, sent, exited in faults.all("exited"))
    if exits:
        print("SIGTERM to exit (s)  " + "".join(f"{s:.1f} " for s in exits))
    if o["ha"]:
        measured = sorted((s for s in stalls if s != "n/a"), key=float)
        summary = f"; min {measured[0]}, median {measured[(len(measured) + 1) // 2 - 1]}, max {measured[-1]}" if measured else ""
        print(f"fleet stalled (s)    {' '.join(stalls) or 'none'} (per failover: the longest pause between committed versions that overlaps it){summary}")
        kills, failovers = faults.all("ha-kill"), faults.all("ha-failover")
        print(f"PostgreSQL HA        primary SIGKILLed {len(kills)} of {o['ha_kills']} (writes again after {' '.join(k[2] for k in kills)} s; "
              f"killed node a secondary again after {' '.join(k[3] for k in kills)} s); planned failovers {len(failovers)} of "
              f"{o['ha_failovers']} ({' '.join(f[2] for f in failovers)} s)")
    print(f"PostgreSQL faults    {t['pg_terminate_rounds']} of {o['pg_terminates']} termination rounds ({t['in_commit']} backends killed in a commit, "
          f"{t['busy']} in another statement, {t['idle']} idle); {t['pg_restarts']} of {o['pg_restarts']} restarts, "
          f"{t['pg_crashes']} of {o['pg_crashes']} crashes (immediate stop), {t['pg_kills']} of {o['pg_kills']} postmaster SIGKILLs")
    if o["cluster"] > 0:
        print(f"RabbitMQ faults      leading node stopped and started {t['amqp_restarts']}, SIGKILLed and started "
              f"{t['node_kills']} of {o['node_kills']} (of {o['cluster']} nodes)")
        down = [fields[1] for fields in faults.lines if fields[0] in ("rabbitmq", "node-kill")]
        print(f"while a node was down {' '.join(down) or '0'} versions committed (per fault)")
        connections = {}
        for log in sorted(Path(work).glob("worker-*.log")):
            for url in re.findall(r"connected to the broker at (\S*)", log.read_text(errors="replace")):
                node = url.split("@")[-1].split("/")[0]
                connections[node] = connections.get(node, 0) + 1
        print("broker connections   " + "".join(f"{node} {n} times  " for node, n in sorted(connections.items())))
    else:
        print(f"RabbitMQ faults      restarted {t['amqp_restarts']}")
    print(f"took                 {faults.moment('ended') - faults.moment('began'):.0f} s (from the servers being up to the end of the audit)")


def cmd_report(work):
    o, faults = options(work), Faults(work)
    ok = check_audit(o, work)
    ok = check_encryption(o, work) and ok
    ok = check_completed_events(work) and ok
    stalls = failover_stalls(faults) if o["ha"] else []
    ok = check_workers(o, work, faults) and ok
    ok = check_outcomes(work) and ok
    print_faults(o, work, faults, stalls)
    return 0 if ok else 1


COMMANDS = {"options": cmd_options, "publish": cmd_publish, "await-leases": cmd_await_leases,
            "await-step": cmd_await_step, "commits-while-down": cmd_commits_while_down,
            "first-queue": cmd_first_queue, "terminate-backends": cmd_terminate_backends,
            "await-outbox": cmd_await_outbox, "tally": cmd_tally, "report": cmd_report}

if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in COMMANDS:
        sys.exit(__doc__)
    sys.exit(COMMANDS[sys.argv[1]](*sys.argv[2:]) or 0)
