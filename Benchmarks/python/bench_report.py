"""The fleet bench's report: ratios, the full run's markdown report, and printing a mode's table."""
import os
import statistics
import time
from pathlib import Path

from bench_common import fmt, log
from bench_jobs import HOT_USERS, USERS
from bench_measure import format_stages


def ratio(a, b):
    return a / b if a and b else None


def pair_rows(results, columns, over, cells="", summary=("median", None)):
    """Table rows for `alternating_pairs`' results: each pair's rates of the two variants named in `columns`, in that
    order, and the ratio of variant `over[0]` to `over[1]`; then the summary of the ratios (`summary`: its label and
    function, the median by default). `cells`: what each row starts with (a group's column)."""
    label, summarize = summary
    summarize = summarize or statistics.median
    rows, ratios = [], []
    for i, rates in enumerate(results):
        r = ratio(rates.get(over[0]), rates.get(over[1]))
        if r:
            ratios.append(r)
        rows.append(f"| {cells}{i + 1} | {fmt(rates.get(columns[0]), '.0f')} | {fmt(rates.get(columns[1]), '.0f')} | "
                    f"{fmt(r, '.2f')} |")
    if ratios:
        rows.append(f"| {cells}{label} | | | **{summarize(ratios):.2f}** |")
    return rows


def render(args, r, best_key, sweep, best_peer, pgbench):
    py_uniform, py_hot = r["py"]["rate"], r["pyhot"]["rate"]
    lines = [
        f"Fleet bench, {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores; Attune: {args.attune_label or args.attune}",
        f"{args.jobs} jobs per throughput scenario (digits MLP 64-32-10, 20 samples, 10 epochs, mini-batch 8, "
        f"50 users; hot: {HOT_USERS} users get half the jobs); Attune routing key: {args.attune_routing_key}.",
        "jobs/s: jobs completed between the 10% and 90% marks of a queue drained from full; CPU s/job: CPU used "
        "between those marks / jobs completed between them. p50/p99: publish -> `completed` at half the peak rate. "
        "vs Python: against the peer's row of the same mix. others' load: cores busy outside the bench meanwhile "
        "(other builds and tests on the machine), the noise each figure carries.",
        "",
        "| scenario | jobs/s | vs Python | p50 ms | p99 ms | worker CPU s/job | broker CPU s/job | db CPU s/job | retrains | others' load |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for key in ("a11", "a12", "a21", "ahot", "alat", "alat4", "a11t", "a12t", "py", "pyhot", "pylat"):
        x = r.get(key)
        if not x:
            continue
        peer = py_hot if key == "ahot" else py_uniform
        cpu = x.get("cpu") or {}
        vs = ratio(x["rate"], peer) if key in ("a11", "a12", "a21", "ahot") else None
        lines.append(
            f"| {x['label']}{' (best)' if key == best_key else ''} | {fmt(x['rate'], '.1f')} | "
            f"{fmt(vs, '.2f', '')}{'x' if vs else ''} | {fmt(x.get('p50'), '.1f', '')} | {fmt(x.get('p99'), '.1f', '')} | "
            f"{fmt(cpu.get('workers'), '.5f', '')} | {fmt(cpu.get('broker'), '.5f', '')} | {fmt(cpu.get('db'), '.5f', '')} | "
            f"{fmt(x['retrains'])} | {fmt(x.get('others'), '.2f', '')} |")

    best = r[best_key]["rate"]
    pg_best = max((t for t in pgbench.values() if t), default=None)
    lat_p99 = r["alat"]["p99"] if r.get("alat") else None
    two_slots = ratio(r["a12t"]["rate"], r["a11t"]["rate"])
    two_slots_small = ratio(r["a12"]["rate"], r["a11"]["rate"])
    two_workers = ratio(r["a21"]["rate"], r["a11"]["rate"])
    same = r["a21"]["rate"]
    hot_loss = 1 - ratio(r["ahot"]["rate"], same) if ratio(r["ahot"]["rate"], same) else None
    attune_retrains = [r[k]["retrains"] for k in ("a11", "a12", "a21", "ahot")]
    counted = all(v is not None for v in attune_retrains)
    targets = [
        ("Attune >= 5x the Python worker's jobs/s", f"{fmt(ratio(best, py_uniform), '.2f')}x",
         (ratio(best, py_uniform) or 0) >= 5),
        ("Attune >= 60% of pgbench's best rate for the one-job transaction",
         f"{fmt(100 * ratio(best, pg_best) if ratio(best, pg_best) else None, '.0f')}% ({fmt(best, '.0f')} of {fmt(pg_best, '.0f')} tps)",
         (ratio(best, pg_best) or 0) >= 0.6),
        ("p99 publish -> completed < 50 ms at half the peak rate", f"{fmt(lat_p99, '.1f')} ms",
         lat_p99 is not None and lat_p99 < 50),
        ("2 slots >= 1.8x one slot where the database is not the limit (training-bound jobs, 1 worker)",
         f"{fmt(two_slots, '.2f')}x, the median of {len(r['slot_pairs'])} pairs run in turn "
         f"({', '.join(fmt(v, '.2f') + 'x' for v in r['slot_pairs'])}) (small jobs: 2 slots {fmt(two_slots_small, '.2f')}x, "
         f"2 workers x 1 slot {fmt(two_workers, '.2f')}x)", (two_slots or 0) >= 1.8),
        ("hot-user mix loses <= 20% of the uniform rate (2 workers x 1 slot both)",
         "n/a" if hot_loss is None else f"{100 * hot_loss:.0f}% lost" if hot_loss >= 0 else f"{-100 * hot_loss:.0f}% faster",
         hot_loss is not None and hot_loss <= 0.2),
        ("retrains counted and printed", ", ".join(fmt(v) for v in attune_retrains), counted),
    ]
    lines += ["", "| target | measured | |", "| --- | --- | --- |"]
    lines += [f"| {t} | {m} | {'PASS' if ok else 'MISS'} |" for t, m, ok in targets]
    lines += ["", "pgbench, the same transaction shape on its own tables (" +
              ", ".join(f"{c} client{'s' if c > 1 else ''}: {fmt(t, '.0f')} tps" for c, t in pgbench.items()) +
              f"); best {fmt(pg_best, '.0f')} tps."]
    lines += ["", "The Python peer's configurations tried (" + ", ".join(
        f"{p} proc x prefetch {q}: {fmt(rate, '.0f')}" for p, q, rate in sweep) +
        f" jobs/s); best: {best_peer[0]} processes, prefetch {best_peer[1]}."]
    for key in ("alat", "alat4"):
        if r.get(key) and r[key].get("stages"):
            lines += ["", f"Where a job's time went, {r[key]['label']} (ms, p50 / p99 of each stage over the jobs; "
                      "the stages of one job need not be its slowest together): " + format_stages(r[key]["stages"]) + "."]
    incomplete = [x["label"] for x in r.values() if isinstance(x, dict) and x.get("done", 0) < x.get("jobs", 0)]
    failed = [f"{x['label']}: {x['failed']}" for x in r.values() if isinstance(x, dict) and x.get("failed")]
    if incomplete:
        lines.append("INCOMPLETE (some jobs never reported completed): " + "; ".join(incomplete))
    if failed:
        lines.append("failed events: " + "; ".join(failed))
    return "\n".join(lines) + "\n"


def print_report(args, lines):
    """A mode's table on stdout, and in --out when given."""
    report = "\n".join(lines)
    print(report)
    if args.out:
        Path(args.out).write_text(report + "\n")
        log(f"report written to {args.out}")


def render_big(args, runs, jobs, best_peer):
    """--only big's table: `runs` is [(key, result, version_summary)]; Attune's rows against the
    peer's best (`best_peer`, a key of runs), for jobs/s and for jobs/s per core."""
    results = {key: r for key, r, _ in runs}
    per_core = lambda r: 1 / r["cpu"]["workers"] if r.get("cpu") and r["cpu"]["workers"] > 0 else None  # noqa: E731
    lines = [
        f"Training-bound fleet bench (--only big), {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores; "
        f"Attune: {args.attune_label or args.attune}",
        f"{jobs} jobs per run: the MLP 784-128-10 (coreml_fixtures.bench_mlp), 200 samples x 5 epochs, mini-batch 32, "
        "SGD lr 0.01 momentum 0.9; the digits drawn 28x28 (each pixel a 3x3 block, 2 blank rows and columns around, "
        f"/16), 200 consecutive rows per job; {len(USERS)} users, uniform; JSON jobs (about 0.7 MB each).",
        "jobs/s: between the 10% and 90% marks of a queue drained from full. CPU s/job: CPU used between those "
        "marks / jobs completed between them. jobs/s per core = 1 / worker CPU s/job: the worker processes' CPU "
        "only (Attune's worker; the peer's parent and its processes), not the broker's or the database's. "
        "loss: the mean (min-max) over the run's versions of each job's last-epoch loss, as its `completed` "
        "event reports it. state KB: what each version stored (mean). bursts: the runs of `completed` events "
        "between the marks (an Attune slot commits and reports up to 32 jobs at once; the peer reports each job).",
        "",
        "| configuration | jobs/s | worker CPU s/job | jobs/s per core | broker CPU s/job | db CPU s/job | "
        "mean loss (min-max) | versions | state KB | bursts | retrains | others' load |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for key, r, (versions, mean, low, high, state) in runs:
        cpu = r.get("cpu") or {}
        lines.append(
            f"| {r['label']}{' (best peer)' if key == best_peer else ''} | {fmt(r['rate'], '.1f')} | "
            f"{fmt(cpu.get('workers'), '.4f')} | {fmt(per_core(r), '.1f')} | {fmt(cpu.get('broker'), '.4f')} | "
            f"{fmt(cpu.get('db'), '.4f')} | {fmt(mean, '.3f')} ({fmt(low, '.3f')}-{fmt(high, '.3f')}) | "
            f"{versions} of {r['jobs']} | {fmt(state / 1000 if state else None, '.0f')} | {fmt(r.get('bursts'))} | "
            f"{fmt(r['retrains'])} | {fmt(r.get('others'), '.2f')} |")
    peer = results[best_peer]
    lines.append("")
    for key, r in results.items():
        if key.startswith("a"):
            times = lambda v: fmt(v, '.2f') + ("x" if v else "")  # noqa: E731
            lines.append(f"{r['label']} / {peer['label']}: jobs/s {times(ratio(r['rate'], peer['rate']))}, "
                         f"jobs/s per core {times(ratio(per_core(r), per_core(peer)))}")
    few = [r["label"] for r in results.values() if (r.get("bursts") or 0) < 8]
    if few:
        lines.append(f"Fewer than 8 bursts between the marks ({'; '.join(few)}): that rate and CPU per job hang on "
                     "where the marks fell within a burst; more --jobs give steadier figures.")
    incomplete = [r["label"] for r in results.values() if r.get("done", 0) < r.get("jobs", 0)]
    failed = [f"{r['label']}: {r['failed']}" for r in results.values() if r.get("failed")]
    if incomplete:
        lines.append("INCOMPLETE (some jobs never reported completed): " + "; ".join(incomplete))
    if failed:
        lines.append("failed events: " + "; ".join(failed))
    return lines


def _celery_settings(profile):
    """Every setting of a Celery profile, in the report's order: (setting, value). What is not in the profile is
    celery_worker.py's app.conf and CeleryFleet.command, the same for every profile."""
    prefetch = (f"{profile.prefetch}" if profile.prefetch is not None
                else "4 (Celery's default: neither --prefetch-multiplier nor the setting given)")
    return [
        ("pool", "prefork, -c 2, 4 and 8, one psycopg connection a child"),
        ("prefetch multiplier (prefetch count = multiplier x -c)", prefetch),
        ("scheduling", "-O fair" if profile.fair else "Celery's default (no -O)"),
        ("`completed` event from the task", "one a job, through Celery's producer pool, as Attune's"
         if profile.publishes_completed else "none (less work a job than Attune)"),
        ("`failed` event from the task", "on a failure" if profile.publishes_completed else "none"),
        ("acks late (task_acks_late)", "on: acked after the commit"),
        ("reject on worker lost", "on: a dead child's job is delivered again"),
        ("acks on failure", "on"),
        ("Celery's task events (worker_send_task_events, -E)", "off (Celery's default)"),
        ("gossip, mingle, heartbeat", "off (--without-*)"),
        ("result backend", "none (task_ignore_result)"),
        ("serializer", "JSON"),
        ("queue", "celerybench.jobs, durable classic, jobs persistent"),
    ]


def _celery_settings_table(profiles):
    """Both (all) profiles' settings side by side, each row saying whether the profiles differ in it."""
    columns = [_celery_settings(profile) for profile in profiles]
    lines = ["| setting | " + " | ".join(profile.name for profile in profiles) + " | |",
             "| --- | " + " | ".join("---" for _ in profiles) + " | --- |"]
    for row, (setting, _) in enumerate(columns[0]):
        values = [column[row][1] for column in columns]
        same = "shared" if len(set(values)) == 1 else "**differs**"
        lines.append(f"| {setting} | " + " | ".join(values) + f" | {same} |")
    return lines


def _celery_effective(runs, profiles):
    """What each profile's worker said it ran with (celery_worker.py's `celery worker settings` line, the last
    run's), and a note when the profiles' scheduling turned out the same in effect."""
    said = {}
    for x in runs:
        if x["kind"] == "celery" and x.get("effective"):
            said[x["profile"].name] = x["effective"]
    lines = [f"- {profile.name}: {said.get(profile.name, 'no settings line in its log')}" for profile in profiles]
    strategies = {text.split("pool scheduling ")[1].split(",")[0] for text in said.values() if "pool scheduling " in text}
    if len(said) > 1 and len(strategies) == 1:
        lines.append(f"  (every profile's pool ran the {strategies.pop()} strategy: Celery 5's prefork pool maps its "
                     "default profile to the same strategy as -O fair, so the profiles differ in prefetch and events)")
    return ["What each profile's Celery worker reported at start, read from its own consumer and pool (its last "
            "run: prefetch count = multiplier x -c):"] + lines


def _celery_verdict(runs, databases, names):
    """Attune's best run against the best Celery run of every profile and concurrency (and round), per database,
    and each profile's best, so the comparison is with the strongest Celery column, not one that suits Attune."""
    def best(db, keep):
        rows = [x for x in runs if x["db"] == db and keep(x)]
        return max(rows, key=lambda x: x["result"]["rate"] or 0) if rows else None

    def where(x):
        return f"{fmt(x['result']['rate'], '.1f')} jobs/s ({x['result']['label']}, round {x['round']})"

    lines = []
    for db in databases:
        attune, celery = best(db, lambda x: x["kind"] == "attune"), best(db, lambda x: x["kind"] == "celery")
        if not attune or not celery:
            continue
        profile_bests = []
        for profile in dict.fromkeys(x["profile"] for x in runs if x["kind"] == "celery"):
            top = best(db, lambda x, profile=profile: x["kind"] == "celery" and x["profile"] == profile)
            profile_bests.append(f"{profile.short} {where(top)}")
        v = ratio(attune["result"]["rate"], celery["result"]["rate"])
        column = f"{celery['profile'].name}, -c {celery['result']['label'].rsplit('-c ', 1)[-1]}"
        lines.append(f"**{names[db]}: Attune best / Celery best = {fmt(v, '.2f')}{'x' if v else ''}**. Attune best: "
                     f"{where(attune)}. Celery best over every profile, -c and round: "
                     f"{fmt(celery['result']['rate'], '.1f')} jobs/s, the column {column} (round {celery['round']}). "
                     f"Each profile's best: {'; '.join(profile_bests)}.")
    return lines


def render_celery(args, runs, jobs, databases, attune_extra, profiles, minutes):
    """--only celery's tables: `runs` is [{round, db, key, kind, result, versions, profile, reported, effective}]
    (kind: celery, pika or attune; profile, reported and effective for Celery's runs); the Celery profiles'
    settings, every row, then per round and database the best of each fleet and Attune's ratios to the peers, with
    two databases each fleet's HA / single, and the verdict against the best Celery column."""
    names = {"single": "single", "ha": "HA pair"}
    kinds = (("celery", "Celery best"), ("pika", "pika peer"), ("attune", "Attune best"))
    rounds = sorted({x["round"] for x in runs})
    lines = [
        f"Celery bench (--only celery), {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores; "
        f"Attune: {args.attune_label or args.attune}",
        f"{jobs} jobs per run (digits MLP 64-32-10, 20 samples, 10 epochs, mini-batch 8, {len(USERS)} users, uniform), "
        f"{len(rounds)} round{'s' if len(rounds) > 1 else ''}; every run queues all its jobs (persistent, confirmed) "
        "before its workers start and begins from empty queues and tables. Database: one durable PostgreSQL"
        + (" (single), then the pg_auto_failover pair (HA pair: a primary and its synchronous standby, both durable, "
           "on the same cores)" if "ha" in databases else "") + ".",
        "Celery: celery_worker.py, Celery 5 prefork, in " + str(len(profiles)) + " profile"
        + ("s" if len(profiles) > 1 else "") + " (settings below). pika peer: python_worker.py, 2 processes, prefetch "
        "16, training_begin + 10 epoch_end + completed events a job. Attune: "
        + (" ".join(attune_extra) if attune_extra
           else "the worker's defaults (--events coalesced: a job over within --progress-after carries its epochs "
                "in its terminal event)")
        + ", at least one `completed` event a job.",
    ]
    if any(not profile.publishes_completed for profile in profiles):
        lines.append("NOTE: the short-task profile does LESS work than Attune: its task publishes no `completed` "
                     "event (Attune publishes one a job, as does the long-task profile); the bench sees its jobs end "
                     "through the worker's own shared counters (a job counts once committed) instead of events.")
    lines += [
        "jobs/s: jobs completed between the 10% and 90% marks of a queue drained from full; CPU s/job: CPU used between "
        "those marks / jobs completed between them (worker: the fleet's process trees, Celery's main process and its "
        "children included). versions: rows committed, of the jobs (job ids are unique: each job applied once). "
        "worker count: the jobs the Celery worker itself counted done (its shutdown line). "
        "others' load: cores busy outside the bench meanwhile.",
        "",
    ]
    lines += _celery_settings_table(profiles) + [""] + _celery_effective(runs, profiles)
    lines += [
        "",
        "| round | database | configuration | jobs/s | worker CPU s/job | broker CPU s/job | db CPU s/job | versions | "
        "worker count | retrains | others' load |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for x in runs:
        r, cpu = x["result"], x["result"].get("cpu") or {}
        count = x.get("reported")
        lines.append(
            f"| {x['round']} | {names[x['db']]} | {r['label']} | {fmt(r['rate'], '.1f')} | {fmt(cpu.get('workers'), '.5f')} | "
            f"{fmt(cpu.get('broker'), '.5f')} | {fmt(cpu.get('db'), '.5f')} | {x['versions']} of {r['jobs']} | "
            f"{count['jobs'] if count else ''} | {fmt(r['retrains'])} | {fmt(r.get('others'), '.2f')} |")

    def best(round_, db, kind):
        rows = [x["result"] for x in runs if x["round"] == round_ and x["db"] == db and x["kind"] == kind]
        return max(rows, key=lambda r: r["rate"] or 0) if rows else None

    def cell(r):
        if r is None:
            return "n/a"
        short = r["label"].replace("Attune ", "").replace("Celery ", "").replace("Python ", "").split(", --")[0]
        return f"{fmt(r['rate'], '.1f')} ({short})"

    times = lambda v: fmt(v, '.2f') + ("x" if v else "")  # noqa: E731
    lines += ["", "| round | database | Celery best (any profile, any -c) | pika peer | Attune best | Attune / Celery | "
              "Attune / pika peer |", "| --- | --- | --- | --- | --- | --- | --- |"]
    summary = {db: {"celery": [], "pika": []} for db in databases}
    for round_ in rounds:
        for db in databases:
            b = {kind: best(round_, db, kind) for kind, _ in kinds}
            rate = {kind: b[kind]["rate"] if b[kind] else None for kind, _ in kinds}
            vs_celery, vs_pika = ratio(rate["attune"], rate["celery"]), ratio(rate["attune"], rate["pika"])
            summary[db]["celery"].append(vs_celery)
            summary[db]["pika"].append(vs_pika)
            lines.append(f"| {round_} | {names[db]} | {cell(b['celery'])} | {cell(b['pika'])} | {cell(b['attune'])} | "
                         f"{times(vs_celery)} | {times(vs_pika)} |")
    if len(databases) > 1:
        lines += ["", "| round | fleet | single jobs/s | HA pair jobs/s | HA / single |", "| --- | --- | --- | --- | --- |"]
        for round_ in rounds:
            for kind, name in kinds:
                single, ha = best(round_, "single", kind), best(round_, "ha", kind)
                a, b = (single or {}).get("rate"), (ha or {}).get("rate")
                lines.append(f"| {round_} | {name} | {fmt(a, '.1f')} | {fmt(b, '.1f')} | {fmt(ratio(b, a), '.2f')} |")
    lines.append("")
    for db in databases:
        lines.append(f"{names[db]}: Attune best / Celery best, each round: "
                     f"{', '.join(times(v) for v in summary[db]['celery'])}; Attune best / pika peer: "
                     f"{', '.join(times(v) for v in summary[db]['pika'])}.")
    lines += _celery_verdict(runs, databases, names)
    results = [x["result"] for x in runs]
    incomplete = [f"round {x['round']} {names[x['db']]} {x['result']['label']}" for x in runs
                  if x["result"].get("done", 0) < x["result"]["jobs"] or x["versions"] != x["result"]["jobs"]
                  or (x.get("reported") and x["reported"]["jobs"] + x["reported"]["failed"] != x["result"]["jobs"])]
    failed = [f"{r['label']}: {r['failed']}" for r in results if r.get("failed")]
    if incomplete:
        lines.append("INCOMPLETE (fewer `completed` events, versions or worker counts than jobs): " + "; ".join(incomplete))
    if failed:
        lines.append("failed events: " + "; ".join(failed))
    lines.append(f"The mode took {minutes:.1f} minutes.")
    return lines
