"""The dashboard in a real headless browser (Debian's chromium and chromium-driver, through selenium): first
without the operator's credential (the page must be refused and nothing of the dashboard run), then with
it (HTTP basic auth, sent by the browser with the page, its scripts and its event stream): wait until it is live, enqueue a job with the attune CLI, and wait until the job's row shows it
completed and its loss chart holds one point per epoch, and that the Content Security Policy refused nothing;
keep a screenshot. Prints one JSON line; exits 1
with the reason on any failure. Run by Tests/AttuneWorkerTests/DashboardTests.swift."""
import argparse
import base64
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("SE_OFFLINE", "true")  # never let selenium try to download a driver
from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--attune", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--user", required=True)
    p.add_argument("--job-id", required=True)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--csv", required=True)
    p.add_argument("--screenshot", required=True)
    p.add_argument("--username", required=True)
    p.add_argument("--password", required=True)
    args = p.parse_args()

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1300,1700"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    try:
        driver.get(args.url)
        # Headless Chromium answers a basic-auth challenge it cannot fill with an empty page.
        time.sleep(1)
        refused = driver.execute_script(
            "return [document.getElementById('status') === null, typeof window.attuneDashboard, typeof window.Chart]")
        if refused != [True, "undefined", "undefined"]:
            fail(f"without the credential the dashboard loaded: {refused!r}")
        credential = base64.b64encode(f"{args.username}:{args.password}".encode()).decode()
        driver.execute_cdp_cmd("Network.enable", {})
        driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {"Authorization": "Basic " + credential}})
        driver.get(args.url)
        wait(driver, "document.getElementById('status').textContent === 'live'", 30, "the page never went live")
        subprocess.run([args.attune, "enqueue", "--model", args.model, "--user", args.user, "--csv", args.csv,
                        "--rows", "0:40", "--epochs", str(args.epochs), "--job-id", args.job_id], check=True,
                       stdout=subprocess.DEVNULL)
        job = json.dumps(args.job_id)
        wait(driver, f"(window.attuneDashboard.jobs.get({job}) || {{}}).state === 'completed'", 60,
             "the job never showed as completed")
        points = wait(driver, f"(window.attuneDashboard.charts.get({job}) || {{data: {{datasets: [{{data: []}}]}}}})"
                              f".data.datasets[0].data.length", 10, "no chart",
                      accept=lambda n: n == args.epochs)
        time.sleep(0.8)  # the table redraws twice a second
        row_text = driver.execute_script(
            "return [...document.querySelectorAll('#jobs tr')].map(r => r.innerText).join('\\n')")
        if args.job_id not in row_text or "completed" not in row_text:
            fail(f"the jobs table lacks the job: {row_text[:500]}")
        canvas = driver.execute_script(f"return !!document.querySelector('#charts .job[data-job=' + JSON.stringify({job}) + '] canvas')")
        if not canvas:
            fail("no canvas for the job's chart")
        driver.save_screenshot(args.screenshot)
        blocked = [e["message"] for e in driver.get_log("browser")
                   if "Content Security Policy" in e["message"] or "Refused to" in e["message"]]
        if blocked:
            fail(f"the Content Security Policy blocked part of the dashboard: {blocked[:3]}")
        print(json.dumps({"points": points, "row": True, "refused_without_credential": True,
                          "screenshot": args.screenshot}))
    finally:
        driver.quit()


def wait(driver, expression, seconds, message, accept=bool):
    deadline = time.time() + seconds
    value = None
    while time.time() < deadline:
        value = driver.execute_script("return " + expression)
        if accept(value):
            return value
        time.sleep(0.2)
    fail(f"{message} (last value {value!r})")


def fail(message):
    print(message, file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
    main()
