"""A burst of devices that all miss serve's cache at once, and what serve holds while it answers them.

Each device is a user of its own (never asked for before, so its head is not cached), with its own device
token, on its own TCP connection; all connect together and send one GET for their personal model. While the
burst runs, a sampler reads serve's threads (/proc/PID/status) and its PostgreSQL sessions
(pg_stat_activity, every backend but the sampler's own) every 10 ms.

    python device_burst.py --url http://127.0.0.1:PORT --pid PID --database-url URL --key-file app.jwk \
        --model digits --devices 1000 --prefix r1 --label attune

prints one JSON line: statuses, answer times (p50/p99/max) and the peaks of threads and connections.
"""
import argparse
import asyncio
import json
import threading
import time

import jwt


def sign_tokens(key_file, users, ttl=3600):
    with open(key_file) as f:
        jwk = json.load(f)
    key = jwt.PyJWK(jwk).key
    now = int(time.time())
    return [jwt.encode({"sub": user, "aud": "attune", "iat": now, "exp": now + ttl}, key, algorithm="EdDSA",
                       headers={"kid": jwk["kid"]}) for user in users]


async def one_device(host, port, path, token, start, results):
    await start.wait()
    began = time.perf_counter()
    try:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n"
                     f"Connection: close\r\n\r\n".encode())
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        await reader.read()  # the body, to the close
        writer.close()
        results.append((status, time.perf_counter() - began))
    except Exception as error:  # a refused or reset connection is a result too
        results.append((f"error:{type(error).__name__}", time.perf_counter() - began))


def sampler(pid, database_url, stop, peaks):
    import subprocess
    psql = subprocess.Popen(["psql", "-XAtq", database_url], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            bufsize=1)
    query = "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid();\n"
    while not stop.is_set():
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Threads:"):
                    peaks["threads"] = max(peaks["threads"], int(line.split()[1]))
        psql.stdin.write(query)
        peaks["connections"] = max(peaks["connections"], int(psql.stdout.readline()))
        time.sleep(0.01)
    psql.stdin.close()
    psql.wait()


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--database-url", required=True)
    p.add_argument("--key-file", required=True)
    p.add_argument("--model", default="digits")
    p.add_argument("--devices", type=int, default=1000)
    p.add_argument("--prefix", required=True, help="names this burst's users, so none was asked for before")
    p.add_argument("--label", default="")
    args = p.parse_args()
    host, port = args.url.split("//", 1)[1].rsplit(":", 1)
    users = [f"{args.prefix}-device-{i}" for i in range(args.devices)]
    tokens = sign_tokens(args.key_file, users)

    peaks = {"threads": 0, "connections": 0}
    stop = threading.Event()
    watcher = threading.Thread(target=sampler, args=(args.pid, args.database_url, stop, peaks))
    watcher.start()
    time.sleep(0.1)
    before = dict(peaks)

    async def burst():
        start = asyncio.Event()
        results = []
        tasks = [asyncio.create_task(one_device(host, int(port), f"/v1/models/{args.model}/users/{user}", token, start,
                                                results)) for user, token in zip(users, tokens)]
        await asyncio.sleep(0.05)
        began = time.perf_counter()
        start.set()
        await asyncio.gather(*tasks)
        return results, time.perf_counter() - began

    results, wall = asyncio.run(burst())
    time.sleep(0.05)
    stop.set()
    watcher.join()
    statuses = {}
    for status, _ in results:
        statuses[str(status)] = statuses.get(str(status), 0) + 1
    times = [seconds * 1000 for _, seconds in results]
    print(json.dumps({
        "label": args.label, "devices": args.devices, "statuses": statuses, "wall_s": round(wall, 3),
        "p50_ms": round(percentile(times, 0.50), 1), "p99_ms": round(percentile(times, 0.99), 1),
        "max_ms": round(max(times), 1), "threads_idle": before["threads"], "threads_peak": peaks["threads"],
        "connections_idle": before["connections"], "connections_peak": peaks["connections"],
    }))


if __name__ == "__main__":
    main()
