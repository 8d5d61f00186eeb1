"""Benchmarks/dashboard-load.sh's driver: for each count of tabs, one headless Chromium (Debian's, through
selenium with SE_OFFLINE) with that many tabs on the dashboard, all live, then --seconds of the page polling as
it does by itself, measured from outside: the tabs' requests (Resource Timing in each tab, /api/* and the page),
serve's CPU (/proc/PID/stat), PostgreSQL's xact_commit and tup_returned (pg_stat_database, through psql), the
broker's connection and channel churn (rabbitmqctl eval of connection_churn_metrics), and Chromium's CPU (every
process under chromedriver). 0 tabs is the baseline: the workers' own lease sessions and heartbeats. Prints a
Markdown table; nothing is asserted."""
import argparse
import base64
import os
import subprocess
import time

os.environ.setdefault("SE_OFFLINE", "true")
from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def tree_cpu(root):
    """CPU seconds of `root` and every process under it, now."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
                children.setdefault(parent, []).append(int(entry))
            except (OSError, ValueError):
                pass
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        try:
            total += cpu_seconds(pid)
        except OSError:
            pass
        todo += children.get(pid, [])
    return total


def postgres(url):
    out = subprocess.run(["psql", url, "-Atc", "SELECT pg_stat_force_next_flush(); SELECT xact_commit, tup_returned, "
                          "tup_fetched FROM pg_stat_database WHERE datname = current_database()"],
                         check=True, capture_output=True, text=True).stdout.split()
    return [int(v) for v in out[-1].split("|")]


def broker_churn(directory):
    out = subprocess.run([os.path.join(REPO, "scripts/rabbitmqctl.sh"), directory, "eval",
                          "[{_, C, _, Ch, _, _, _, _}] = ets:tab2list(connection_churn_metrics), {C, Ch}."],
                         check=True, capture_output=True, text=True).stdout.strip()
    created, channels = out.strip("{}").split(",")
    return int(created), int(channels)


def open_tabs(args, count):
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1300,1000",
                 "--disable-background-timer-throttling", "--disable-renderer-backgrounding",
                 "--disable-backgrounding-occluded-windows"):
        options.add_argument(flag)
    service = Service("/usr/bin/chromedriver")
    driver = webdriver.Chrome(service=service, options=options)
    credential = base64.b64encode(f"{args.username}:{args.password}".encode()).decode()
    handles = []
    for i in range(count):
        if i:
            driver.switch_to.new_window("tab")
        driver.execute_cdp_cmd("Network.enable", {})
        driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {"Authorization": "Basic " + credential}})
        driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument",
                               {"source": "performance.setResourceTimingBufferSize(100000);"})
        driver.get(args.url)
        deadline = time.time() + 60
        while driver.execute_script("return (document.getElementById('status') || {}).textContent") != "live":
            if time.time() > deadline:
                raise SystemExit(f"tab {i + 1} never went live")
            time.sleep(0.2)
        handles.append(driver.current_window_handle)
    return driver, service, handles


def requests_since(driver, handles, marks):
    """Requests each tab started since its mark (performance.now() at the start), summed."""
    total = 0
    for handle, mark in zip(handles, marks):
        driver.switch_to.window(handle)
        total += driver.execute_script(
            "return performance.getEntriesByType('resource').filter(e => e.startTime >= arguments[0]).length", mark)
    return total


def measure(args, count):
    driver = service = None
    handles = []
    if count:
        driver, service, handles = open_tabs(args, count)
    time.sleep(5)  # every tab past its first loads
    marks = []
    for handle in handles:
        driver.switch_to.window(handle)
        marks.append(driver.execute_script("return performance.now()"))
    serve0, pg0, mq0 = cpu_seconds(args.serve_pid), postgres(args.database_url), broker_churn(args.rabbitmq_dir)
    browser0 = tree_cpu(service.process.pid) if service else 0.0
    started = time.monotonic()
    time.sleep(args.seconds)
    took = time.monotonic() - started
    serve1, pg1, mq1 = cpu_seconds(args.serve_pid), postgres(args.database_url), broker_churn(args.rabbitmq_dir)
    browser1 = tree_cpu(service.process.pid) if service else 0.0
    requests = requests_since(driver, handles, marks) if count else 0
    if driver:
        driver.quit()
    return {"tabs": count, "seconds": took, "requests": requests, "serve_cpu": serve1 - serve0,
            "xacts": pg1[0] - pg0[0], "rows": pg1[1] - pg0[1], "connections": mq1[0] - mq0[0],
            "channels": mq1[1] - mq0[1], "browser_cpu": browser1 - browser0}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--username", required=True)
    p.add_argument("--password", required=True)
    p.add_argument("--serve-pid", type=int, required=True)
    p.add_argument("--database-url", required=True)
    p.add_argument("--rabbitmq-dir", required=True)
    p.add_argument("--seconds", type=float, default=30)
    p.add_argument("--tabs", default="0 1 5")
    p.add_argument("--build", default="release")
    args = p.parse_args()
    rows = []
    for count in [int(t) for t in args.tabs.split()]:
        print(f"== {count} tab(s), {args.seconds:.0f} s", flush=True)
        rows.append(measure(args, count))
    base = next((r for r in rows if r["tabs"] == 0), None)
    print()
    print("| tabs | requests/s to serve | serve CPU s/s | serve CPU s/s per tab (above 0 tabs) | PostgreSQL xact/s "
          "(above 0 tabs) | rows read/s (above 0 tabs) | AMQP connections opened/s | channels opened/s | "
          "Chromium CPU s/s per tab |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        s = r["seconds"]
        per = lambda key: r[key] / s  # noqa: E731
        above = lambda key: (r[key] - base[key] * s / base["seconds"]) / s if base else float("nan")  # noqa: E731
        tabs = r["tabs"]
        print(f"| {tabs} | {per('requests'):.2f} | {per('serve_cpu'):.3f} | "
              f"{(above('serve_cpu') / tabs if tabs else 0):.3f} | {per('xacts'):.1f} ({above('xacts'):+.1f}) | "
              f"{per('rows'):.0f} ({above('rows'):+.0f}) | {per('connections'):.2f} | {per('channels'):.2f} | "
              f"{(per('browser_cpu') / tabs if tabs else 0):.3f} |")
    print()
    print(f"{args.seconds:.0f} s per row after the tabs went live; attune {args.build} build; {os.cpu_count()} cores shared "
          "by Chromium, serve, 2 idle workers, PostgreSQL and RabbitMQ; the 0-tab row is the fleet without the page")


if __name__ == "__main__":
    main()
