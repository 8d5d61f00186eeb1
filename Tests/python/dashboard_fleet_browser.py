"""The operators' dashboard on a whole fleet, in a real headless browser (Debian's chromium and chromium-driver
through selenium, SE_OFFLINE): run by Tests/AttuneWorkerIntegrationTests/DashboardTests.swift, which starts the
fleet (3 worker processes, each with its own --metrics-port, and `attune serve --worker-metrics-ports`) and hands
over what it needs. In the page, with assertions:

1. Workers: the 3 workers are `live` in #workers; one is killed with SIGKILL; its row turns `gone`, the other two
   hold every partition between them and #queues-summary says no partition is unheld.
2. A hot user parked: one job of another user of the partition, then a backlog of the hot user's jobs: #queues
   gets the partition's `parked` row saying "1 hot user(s) parked", and neither the fleet view nor /api/fleet
   names the hot user.
3. 20 dead letters (one naming a model imported only afterwards, jobs naming a model that does not exist,
   malformed JSON bodies): #dlq lists 20; the late model is imported, its job is replayed from its row's button
   and another one purged from its own, each after the confirmation the page asks (answered through selenium's
   alert API, its question checked); the depth goes 20 -> 18, the replayed job completes, and #audit shows both
   actions with the operator's name.
4. Jobs found by id: the replayed job shows `completed`, a dead-lettered one `failed` with its reason.
5. Forged actions refused: a POST from the page's context without the X-Attune-CSRF header, with a wrong one, and
   as a form would send it (text/plain): 403 each, nothing purged, nothing written to the audit log.
6. Under load: small valid jobs published at --rate jobs/s (a separate process) for --load-seconds while the page
   polls; the page's own /api/fleet fetch times (window.attuneDashboard.state.fleetMillis) and the time to the
   first rendered worker row over a few reloads are measured and printed, with the rates achieved. Nothing is
   asserted on time.

A screenshot of each view (#fleet, #jobs-view, #dead-view, #audit-view) is written to --screenshots as
dashboard-*.png. Prints one JSON line of figures; exits 1 with the reason on any failure."""
import argparse
import base64
import gzip
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid

os.environ.setdefault("SE_OFFLINE", "true")  # never let selenium try to download a driver
import pika  # noqa: E402
from selenium import webdriver  # noqa: E402
from selenium.common.exceptions import (ElementClickInterceptedException, NoSuchElementException,  # noqa: E402
                                        StaleElementReferenceException, TimeoutException, WebDriverException)  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

# Installed before the page's own scripts on every load: the time (ms from navigation start) at which the first
# worker row was drawn.
FIRST_RENDER = """
window.__attuneFirstRender = null;
document.addEventListener("DOMContentLoaded", () => {
  const body = document.getElementById("workers");
  if (!body) return;
  new MutationObserver((_, observer) => {
    if (body.rows.length && window.__attuneFirstRender === null) { window.__attuneFirstRender = performance.now(); observer.disconnect(); }
  }).observe(body, { childList: true });
});
"""


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--username", required=True)
    p.add_argument("--password", required=True)
    p.add_argument("--attune", required=True)
    p.add_argument("--amqp-url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--model-file", required=True, help="the .mlmodel imported as --model, imported again as the late model")
    p.add_argument("--csv", required=True)
    p.add_argument("--workers", required=True, help="name:pid,name:pid,name:pid")
    p.add_argument("--partitions", type=int, default=64)
    p.add_argument("--hot-user", required=True)
    p.add_argument("--other-user", required=True)
    p.add_argument("--hot-queue", required=True)
    p.add_argument("--hot-jobs", type=int, default=300)
    p.add_argument("--rate", type=int, default=1000)
    p.add_argument("--load-seconds", type=float, default=20)
    p.add_argument("--reloads", type=int, default=3)
    p.add_argument("--screenshots", required=True)
    args = p.parse_args()
    workers = [tuple(w.split(":")) for w in args.workers.split(",")]
    rows = read_rows(args.csv)
    tag = uuid.uuid4().hex[:8]
    figures, problems = {}, []

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    options.set_capability("unhandledPromptBehavior", "ignore")
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1300,1500",
                 "--hide-scrollbars"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    broker = pika.BlockingConnection(pika.URLParameters(args.amqp_url))
    channel = broker.channel()
    channel.confirm_delivery()
    try:
        credential = base64.b64encode(f"{args.username}:{args.password}".encode()).decode()
        driver.execute_cdp_cmd("Network.enable", {})
        driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {"Authorization": "Basic " + credential}})
        driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": FIRST_RENDER})
        driver.get(args.url)
        wait(driver, "document.getElementById('status').textContent === 'live'", 60, "the page never went live")
        wait(driver, "document.getElementById('operator').textContent.includes(" + json.dumps(args.username) + ")", 10,
             "the operator's name never showed")

        # 1. Workers: 3 live, each with its /metrics read (slots shown), then one killed.
        names = [name for name, _ in workers]
        states = wait(driver, WORKER_STATES, 40, "the 3 workers never showed live with their slots",
                      accept=lambda s: s and all(s.get(n, {}).get("state") == "live" and s[n]["slots"] for n in names))
        killed_name, killed_pid = workers[-1]
        os.kill(int(killed_pid), signal.SIGKILL)
        killed_at = time.monotonic()
        survivors = names[:-1]

        def taken_over(s):
            if not s or s.get(killed_name, {}).get("state") != "gone":
                return False
            if any(s.get(n, {}).get("state") != "live" for n in survivors):
                return False
            held = sum(len(s[n]["partitions"].split()) for n in survivors if s[n]["partitions"] != "stands by")
            return held == args.partitions and s["__summary"].startswith("(0 partition(s) unheld")
        states = wait(driver, WORKER_STATES, 60, "the killed worker never showed gone with its partitions taken",
                      accept=taken_over)
        figures["takeover_seconds_seen"] = round(time.monotonic() - killed_at, 1)
        # And it stays so: no partition unheld a few seconds later.
        time.sleep(4)
        states = wait(driver, WORKER_STATES, 10, "partitions unheld after the takeover", accept=taken_over)
        figures["workers"] = {n: states[n]["state"] for n in names}

        # 2. A hot user parked: the other user seen first, then the hot user's backlog, all in one partition.
        publish(channel, [job(f"other-{tag}", args.other_user, args.model, rows, 0, 20, 2)])
        publish(channel, [job(f"hot-{tag}-{i:04d}", args.hot_user, args.model, rows, (i * 7) % 1500, 150, 10)
                          for i in range(args.hot_jobs)])
        parked = wait(driver, f"""(() => {{ const row = document.querySelector('#queues tr[data-kind=parked][data-queue="{args.hot_queue}.parked"]');
                                   return row ? row.innerText : null; }})()""", 60, "no parked row for the hot user's partition")
        if "1 hot user(s) parked" not in parked:
            fail(f"the parked row does not say 1 hot user parked: {parked!r}")
        leaked = driver.execute_script(
            "return [document.getElementById('fleet').innerText.includes(arguments[0]),"
            " JSON.stringify(window.attuneDashboard.state.fleet).includes(arguments[0])]", args.hot_user)
        if leaked != [False, False]:
            where = driver.execute_script("""const text = JSON.stringify(window.attuneDashboard.state.fleet);
                const at = text.indexOf(arguments[0]); return at < 0 ? null : text.slice(Math.max(0, at - 300), at + 100);""", args.hot_user)
            fail(f"the fleet view or /api/fleet names the hot user: {leaked}; {where}")
        figures["parked_row"] = parked.replace("\t", " | ")
        screenshot(driver, "fleet", args.screenshots, figures)

        # 3. 20 dead letters: 1 for a model imported later, 15 for a model that does not exist, 4 malformed.
        late_model = args.model + "_late"
        late = f"dead-late-{tag}"
        dead = [job(late, f"late-user-{tag}", late_model, rows, 0, 10, 2)]
        dead += [job(f"dead-{tag}-{i:02d}", f"dead-user-{i % 5}-{tag}", "no_such_model", rows, i, 5, 1) for i in range(15)]
        publish(channel, dead)
        malformed = [f"dead-malformed-{tag}-{i}" for i in range(4)]
        for i, job_id in enumerate(malformed):
            channel.basic_publish("attune.jobs", f"malformed-user-{i}", b'{"jobId": "x", "samples": [ {',
                                  pika.BasicProperties(content_type="application/json", message_id=job_id, delivery_mode=2),
                                  mandatory=True)
        ids = [j[0] for j in dead] + malformed
        wait(driver, DLQ_IDS, 90, "the 20 dead letters never showed in #dlq",
             accept=lambda listed: listed is not None and set(ids) <= set(listed) and len(listed) == 20)
        wait(driver, "document.getElementById('dlq-depth').textContent", 10, "#dlq-depth never said 20",
             accept=lambda t: t.startswith("(20 in the queue"))
        figures["dead_letters_before"] = 20

        subprocess.run([args.attune, "model", "import", args.model_file, "--name", late_model], check=True,
                       stdout=subprocess.DEVNULL)
        purged = dead[1][0]
        questions = [click_and_confirm(driver, late, "button.replay", f"Replay dead job {late}?"),
                     click_and_confirm(driver, purged, "button.purge", f"Delete dead job {purged} for good?")]
        listed = wait(driver, DLQ_IDS, 30, "the dead letters never went 20 -> 18 in #dlq",
                      accept=lambda listed: listed is not None and len(listed) == 18)
        if late in listed or purged in listed:
            fail(f"the replayed or purged job is still listed: {late in listed}, {purged in listed}")
        depth_text = wait(driver, "document.getElementById('dlq-depth').textContent", 10, "#dlq-depth never said 18",
                          accept=lambda t: t.startswith("(18 in the queue"))
        audit = wait(driver, AUDIT_ROWS, 20, "the audit log never showed both actions",
                     accept=lambda a: a and {"dlq-replay", "dlq-purge"} <= {r[3] for r in a})
        for action, target in (("dlq-replay", late), ("dlq-purge", purged)):
            row = next(r for r in audit if r[3] == action)
            if row[1] != args.username or row[4] != f"job {target}" or row[5] != "1" or row[2] != "dashboard":
                fail(f"the audit row of {action} is {row}")
        figures.update(dead_letters_after=18, dlq_depth_text=depth_text, confirmations=questions,
                       audit=[r[1:] for r in audit])

        # 4. Jobs found by id: the replayed one completes, a dead-lettered one says why it failed. A wrong answer here
        # is noted and the run goes on (the figures below are still worth having); it fails the run at the end.
        failed = dead[2][0]
        found = search(driver, [late, failed, malformed[0]], lambda rows: rows.get(late, {}).get("state") == "completed"
                       and rows.get(failed, {}).get("state") == "failed" and malformed[0] in rows)
        if isinstance(found, str):
            problems.append(found)
        else:
            if "no_such_model" not in found[failed]["reason"]:
                problems.append(f"the failed job's reason does not say why: {found[failed]}")
            if found[malformed[0]]["state"] != "failed" or "JSON" not in found[malformed[0]]["reason"]:
                problems.append(f"the malformed job's row: {found[malformed[0]]}")
        figures["search"] = found

        # 5. Forged actions from the page's context: the credential goes with them, the token does not.
        forged = [forge(driver, {"Content-Type": "application/json"}),
                  forge(driver, {"Content-Type": "application/json", "X-Attune-CSRF": "0" * 64}),
                  forge(driver, {"Content-Type": "text/plain"})]
        if [status for status, _ in forged] != [403, 403, 403]:
            fail(f"a forged purge was not refused: {forged}")
        time.sleep(4.5)  # the fleet's snapshot is remade at most every 2 s; the page polls every 3 s
        still = driver.execute_async_script("""const done = arguments[arguments.length - 1];
            Promise.all([fetch('/api/fleet').then(r => r.json()), fetch('/api/actions').then(r => r.json())])
              .then(([fleet, actions]) => done([fleet.deadLetters.depth, actions.length])).catch(e => done(String(e)));""")
        if still != [18, len(audit)]:
            fail(f"after the forged purges: depth and audit rows {still}, expected [18, {len(audit)}]")
        figures["forged"] = [f"{status} {text.strip()[:80]}" for status, text in forged]
        for view in ("jobs-view", "dead-view", "audit-view"):
            screenshot(driver, view.replace("-view", ""), args.screenshots, figures)

        blocked = [e["message"] for e in driver.get_log("browser")
                   if "Content Security Policy" in e["message"] or "Refused to" in e["message"]]
        if blocked:
            fail(f"the Content Security Policy blocked part of the dashboard: {blocked[:3]}")

        # 6. Under load: the page's answer times while small jobs arrive at --rate a second.
        figures["load"] = under_load(driver, args, rows, tag)
        figures["problems"] = problems
        print(json.dumps(figures, sort_keys=True))
        if problems:
            fail("; ".join(problems))
    finally:
        try:
            broker.close()
        except Exception:  # noqa: BLE001
            pass
        driver.quit()


WORKER_STATES = """(() => { const out = {}; const rows = document.querySelectorAll('#workers tr');
  if (!rows.length) return null;
  rows.forEach(r => { out[r.dataset.worker] = { state: r.dataset.state, slots: r.cells[5].textContent,
                                                 partitions: r.cells[8].textContent }; });
  out.__summary = document.getElementById('queues-summary').textContent; return out; })()"""
DLQ_IDS = """window.attuneDashboard.state.fleet && !window.attuneDashboard.state.fleet.deadLetters.busy
  ? [...document.querySelectorAll('#dlq tr')].map(r => r.dataset.job) : null"""
AUDIT_ROWS = "[...document.querySelectorAll('#audit tr')].map(r => [...r.cells].map(c => c.textContent))"


def read_rows(path):
    with gzip.open(path, "rt") as f:
        lines = [line.strip().split(",") for line in f if line.strip()]
    return [([float(v) for v in cells[:-1]], cells[-1]) for cells in lines]


def job(job_id, user, model, rows, start, samples, epochs):
    """(job id, user, JSON body) of a training job on `samples` digits rows from `start`."""
    chosen = [rows[(start + k) % len(rows)] for k in range(samples)]
    body = {"jobId": job_id, "userId": user, "model": model, "parameters": {"epochs": epochs},
            "samples": [{"features": {"pixels": {"multiArray": {"values": values}}, "digit": {"stringValue": label}}}
                        for values, label in chosen]}
    return job_id, user, json.dumps(body).encode()


def publish(channel, jobs):
    """Confirmed, mandatory, persistent publishes to attune.jobs, routed by user (as examples/python/producer.py)."""
    for job_id, user, body in jobs:
        channel.basic_publish("attune.jobs", user, body, pika.BasicProperties(
            content_type="application/json", message_id=job_id, delivery_mode=2), mandatory=True)


def click_and_confirm(driver, job_id, selector, question):
    """Clicks the button of `job_id`'s #dlq row (the table is redrawn every poll: found again if it went stale or
    moved under the pointer), checks the confirmation the page asks, and accepts it."""
    deadline = time.time() + 20
    while True:
        try:
            button = driver.find_element(By.CSS_SELECTOR, f'#dlq tr[data-job="{job_id}"] {selector}')
            driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", button)
            button.click()
            break
        except (StaleElementReferenceException, ElementClickInterceptedException, NoSuchElementException) as error:
            if time.time() > deadline:
                fail(f"could not click {selector} of {job_id}: {error.msg}")
            time.sleep(0.3)
    try:
        alert = WebDriverWait(driver, 5).until(expected_conditions.alert_is_present())
    except TimeoutException:
        fail(f"{selector} of {job_id} asked no confirmation")
    asked = alert.text
    if asked != question:
        fail(f"the confirmation asked {asked!r}, not {question!r}")
    alert.accept()
    return asked


def search(driver, ids, done):
    """Types `ids` into #search-ids, submits #search-form (its button, as a person would), until `done` holds of
    the #search-results rows: {job id: {state, reason}}; else what the rows said, as text."""
    deadline = time.time() + 30
    found = {}
    while time.time() < deadline:
        box = driver.find_element(By.ID, "search-ids")
        box.clear()
        box.send_keys("\n".join(ids))
        driver.find_element(By.CSS_SELECTOR, "#search-form button").click()
        time.sleep(0.5)
        found = driver.execute_script("""const out = {}; document.querySelectorAll('#search-results tr').forEach(r => {
            if (r.dataset.job) out[r.dataset.job] = { state: r.dataset.state, shown: r.cells[3].textContent, reason: r.cells[4].textContent }; });
            return out;""")
        if done(found):
            for row in found.values():
                if row["shown"] != row["state"]:
                    fail(f"a search row shows {row['shown']!r} for state {row['state']!r}")
                del row["shown"]
            return found
        time.sleep(1)
    shown = driver.execute_script("return document.getElementById('search-results').innerText")
    return f"the search for {ids} never showed the expected states: rows {found}, text {shown[:300]!r}"


def forge(driver, headers):
    """A purge of every dead letter POSTed from the page's context with `headers`: (status, body)."""
    return tuple(driver.execute_async_script("""const done = arguments[arguments.length - 1];
        fetch('/api/actions/dlq-purge', { method: 'POST', headers: arguments[0], body: JSON.stringify({ all: true }) })
          .then(r => r.text().then(t => done([r.status, t]))).catch(e => done([0, String(e)]));""", headers))


def screenshot(driver, view, directory, figures):
    """The section's element screenshot as dashboard-VIEW.png, its colours reduced when Pillow is there."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"dashboard-{view}.png")
    element = driver.find_element(By.ID, "fleet" if view == "fleet" else f"{view}-view")
    driver.execute_script("arguments[0].scrollIntoView()", element)
    element.screenshot(path)
    try:
        from PIL import Image
        with Image.open(path) as image:
            image.convert("RGB").quantize(colors=64).save(path, optimize=True)
    except ImportError:
        pass
    with open(path, "rb") as f:
        if f.read(4) != b"\x89PNG":
            fail(f"{path} is not a PNG")
    figures.setdefault("screenshots", {})[view] = [path, os.path.getsize(path)]


def producer(amqp_url, rate, seconds, bodies, counts):
    """Publishes `bodies` round and round at `rate` a second for `seconds` (no confirms: a fast producer), and
    puts how many it published and in how long."""
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    channel = connection.channel()
    started = time.monotonic()
    sent = 0
    while True:
        elapsed = time.monotonic() - started
        if elapsed >= seconds:
            break
        due = min(int(elapsed * rate) + 1, int(seconds * rate))
        while sent < due:
            job_id, user, body = bodies[sent % len(bodies)]
            channel.basic_publish("attune.jobs", user, body.replace(b"@N@", b"%07d" % sent), pika.BasicProperties(
                content_type="application/json", message_id=job_id.replace("@N@", "%07d" % sent), delivery_mode=2))
            sent += 1
        connection.sleep(0.005)
    counts.put((sent, time.monotonic() - started))
    connection.close()


def percentiles(values):
    v = sorted(values)
    if not v:
        return {"n": 0}
    pick = lambda q: round(v[min(len(v) - 1, max(0, int(q * len(v) + 0.999999) - 1))], 1)  # noqa: E731 nearest rank
    return {"n": len(v), "p50": pick(0.5), "p95": pick(0.95), "max": round(v[-1], 1)}


def under_load(driver, args, rows, tag):
    users = [f"load-{tag}-u{u:03d}" for u in range(256)]
    bodies = [job(f"load-{tag}-@N@", users[i % len(users)], args.model, rows, i, 2, 1) for i in range(512)]
    counts = multiprocessing.Queue()
    publisher = multiprocessing.Process(target=producer, args=(args.amqp_url, args.rate, args.load_seconds, bodies, counts))
    started_wall = time.time()
    publisher.start()
    deadline = time.monotonic() + args.load_seconds
    time.sleep(3)
    # Reloads first, for the time to first render; then the last page as it polls, with a few more fetches on the
    # side (each 2.2 s, so that most find the snapshot old: it is remade at most every 2 s), until the load ends.
    # A page that draws no worker row within 30 s, or whose script does not answer within 10 s (its main thread
    # busy), is counted, not failed: under load, timings are only printed.
    driver.set_script_timeout(10)
    driver.set_page_load_timeout(30)
    fleet_millis, first_render, no_render, unresponsive = [], [], 0, 0

    def ask(script, *arguments):
        nonlocal unresponsive
        try:
            return driver.execute_script(script, *arguments)
        except (TimeoutException, WebDriverException):
            unresponsive += 1
            return None
    for _ in range(args.reloads):
        reloaded = time.monotonic()
        try:
            driver.refresh()
        except (TimeoutException, WebDriverException):
            unresponsive += 1
        while time.monotonic() - reloaded < 30:
            shown = ask("return window.__attuneFirstRender")
            if shown:
                first_render.append(shown)
                break
            time.sleep(0.2)
        else:
            no_render += 1
        time.sleep(1.5)
        fleet_millis += ask("return window.attuneDashboard.state.fleetMillis") or []
        if time.monotonic() > deadline:
            break
    before = ask("return window.attuneDashboard.state.fleetMillis.length") or 0
    ask("window.__attuneExtra = setInterval(() => loadFleet(), 2200)")
    time.sleep(max(1.0, deadline - time.monotonic()))
    fleet_millis += ask("return window.attuneDashboard.state.fleetMillis.slice(arguments[0])", before) or []
    ask("clearInterval(window.__attuneExtra)")
    publisher.join(args.load_seconds + 60)
    sent, took = counts.get(timeout=10)
    ended_wall = time.time()
    time.sleep(5.5)  # the throughput interval the load ended in is filled, and read by the next snapshot
    fleet = json.loads(urllib.request.urlopen(urllib.request.Request(
        args.url + "api/fleet", headers={"Authorization": "Basic " + base64.b64encode(
            f"{args.username}:{args.password}".encode()).decode()}), timeout=30).read())
    width = fleet["throughputIntervalSeconds"]
    during = [i["jobs"] for i in fleet["throughput"]
              if started_wall <= iso_seconds(i["start"]) and iso_seconds(i["start"]) + width <= ended_wall + 0.5]
    backlog = sum(q.get("depth") or 0 for q in fleet["queues"] if q["kind"] in ("partition", "parked"))
    return {
        "rate_asked": args.rate, "published": sent, "published_per_second": round(sent / took, 1),
        "completed_per_second": round(sum(during) / (len(during) * width), 1) if during else None,
        "completed_intervals": during, "interval_seconds": width,
        "backlog_after": backlog, "live_workers": sum(w["state"] == "live" for w in fleet["workers"]),
        "fleet_fetch_ms": percentiles(fleet_millis),
        # How long serve took to make each snapshot the page was given (the rest of a fetch is the wait for
        # the browser's busy main thread, the network and a snapshot under way).
        "snapshot_made_ms": percentiles(ask("return window.attuneDashboard.state.snapshotMillis") or []),
        "first_render_ms": percentiles(first_render), "reloads_without_render_in_60s": no_render,
        "page_jobs_held": ask("return window.attuneDashboard.jobs.size"),
        "page_scripts_unanswered_in_10s": unresponsive,
    }


def iso_seconds(text):
    from datetime import datetime
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def wait(driver, expression, seconds, message, accept=bool):
    deadline = time.time() + seconds
    value = None
    while time.time() < deadline:
        value = driver.execute_script("return " + expression)
        if accept(value):
            return value
        time.sleep(0.25)
    fail(f"{message} (last value {json.dumps(value)[:1500]})")


def fail(message):
    print(message, file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
    main()
