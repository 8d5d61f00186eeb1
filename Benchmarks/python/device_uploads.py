"""Device uploads (PUT /v1/models/{model}/users/{user}) against `attune serve`: answer times at a fixed rate,
the size of an upload, and what the two conflict policies leave a user with. Benchmarks/device-uploads.sh runs it.

    python device_uploads.py latency --url URL --key-file app.jwk --model M --rate 100 --seconds 20 --users 400 \
        --prefix r1 [--content state|mlmodel] [--label NAME]
        An open-loop schedule: upload k is sent at start + k / rate whatever the earlier ones are doing, by user
        k mod users (each user its own token, so uploads do not conflict: a user's next upload names the ETag its
        previous one was answered, If-Match), over a pool of keep-alive connections (a new one only when every
        open one is busy). An answer's time runs from its scheduled send, so a slow server is not hidden by a
        load generator that waits for it. Prints one JSON line.
    python device_uploads.py sizes [--model-file examples/models/digits-pretrained.mlmodel]
        The digits model's state-only upload against its updatable parameters' raw float32 bytes. One JSON line.
    python device_uploads.py policies --url URL --key-file app.jwk --model M --prefix p1 [--writers 6] [--rounds 5]
        For each writer (a block of digits rows: its first 60 rows split between two devices of one user, the
        next 40 held out), two devices train concurrently, round after round, each on its own 30 digits with the
        model's update parameters, and collide every round (both fetch the same head, then both upload): policy
        retrain (the loser fetches the new head and trains again) against policy merge (the loser sends its change
        with If-Match: * and Attune-Trained-From). Then the held-out accuracy of the user's final head, and the
        base's. One JSON line per writer and policy.
Nothing is asserted: figures only.
"""
import argparse
import asyncio
import json
import os
import socket
import sys
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "Tests", "python"))
import device_simulator as sim  # noqa: E402


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


# ---------------------------------------------------------------------------------------------------
# latency at a fixed rate

class Pool:
    """Keep-alive HTTP/1.1 connections to one server; a request takes an idle one or opens another."""

    def __init__(self, host, port):
        self.host, self.port = host, port
        self.idle = []
        self.opened = 0
        self.peak_busy = 0
        self.busy = 0

    async def request(self, method, path, headers, body=b""):
        self.busy += 1
        self.peak_busy = max(self.peak_busy, self.busy)
        try:
            for attempt in (1, 2):
                # serve closes a connection idle for 15 s (--idle-timeout): drop those idle 10 s before using them.
                now = time.monotonic()
                for stale in [c for c in self.idle if now - c[2] > 10]:
                    self.idle.remove(stale)
                    stale[1].close()
                reused = bool(self.idle) and attempt == 1
                if reused:
                    reader, writer, _ = self.idle.pop()
                else:
                    reader, writer = await asyncio.open_connection(self.host, self.port)
                    writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    self.opened += 1
                try:
                    head = f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
                    head += f"Content-Length: {len(body)}\r\n\r\n"
                    writer.write(head.encode("latin-1") + body)
                    await writer.drain()
                    raw = await reader.readuntil(b"\r\n\r\n")
                except (ConnectionError, asyncio.IncompleteReadError):
                    writer.close()
                    if reused and attempt == 1:
                        continue  # serve closed an idle connection: once more on a new one
                    raise
                lines = raw.decode("latin-1").split("\r\n")
                status = int(lines[0].split(" ", 2)[1])
                response_headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        k, v = line.split(":", 1)
                        response_headers[k.strip().lower()] = v.strip()
                data = await reader.readexactly(int(response_headers.get("content-length", "0")))
                if response_headers.get("connection", "").lower() == "close":
                    writer.close()
                else:
                    self.idle.append((reader, writer, time.monotonic()))
                return status, response_headers, data
        finally:
            self.busy -= 1

    def close(self):
        for _, writer, _ in self.idle:
            writer.close()


def upload_bodies(content, count, seed=7, scale=0.01):
    """`count` distinct uploads of the digits model: the base's parameters plus a small random change each."""
    data = open(sim.DIGITS_MODEL, "rb").read()
    net = sim.Network(data)
    rng = np.random.default_rng(seed)
    bodies = []
    for _ in range(count):
        params = {k: (v + rng.normal(0, scale, v.shape)).astype(np.float32) for k, v in net.params.items()}
        bodies.append(net.state(params) if content == "state" else sim.with_parameters(data, params))
    return bodies


def latency(args):
    host, port = args.url.split("//", 1)[1].rsplit(":", 1)
    port = int(port)
    jwk = json.load(open(args.key_file))
    users = [f"{args.prefix}-u{i}" for i in range(args.users)]
    tokens = {u: sim.sign_token(jwk, u) for u in users}
    total = int(args.rate * args.seconds)
    per_user = -(-total // args.users)
    content_type = sim.UPDATE_STATE_TYPE if args.content == "state" else sim.MLMODEL_TYPE
    distinct = min(total, 64)
    bodies = upload_bodies(args.content, distinct)

    async def run():
        pool = Pool(host, port)
        # Each device first fetches its model, as a device does before it trains: the ETag of v0.
        etags = {}

        async def fetch(u):
            status, headers, _ = await pool.request("GET", f"/v1/models/{args.model}/users/{u}",
                                                    {"Authorization": f"Bearer {tokens[u]}"})
            if status != 200:
                raise SystemExit(f"GET for {u} answered {status}")
            etags[u] = [asyncio.get_running_loop().create_future() for _ in range(per_user + 1)]
            etags[u][0].set_result(headers["etag"])
        for i in range(0, len(users), 8):
            await asyncio.gather(*(fetch(u) for u in users[i:i + 8]))
        opened_for_gets, pool.peak_busy = pool.opened, 0
        results = []
        start = time.perf_counter() + 0.2

        async def one(k):
            user, j = users[k % args.users], k // args.users
            scheduled = start + k / args.rate
            await asyncio.sleep(max(0.0, scheduled - time.perf_counter()))
            waited = time.perf_counter()
            if_match = await etags[user][j]  # a user's previous upload must have been answered
            headers = {"Authorization": f"Bearer {tokens[user]}", "Content-Type": content_type, "If-Match": if_match,
                       "Idempotency-Key": f"{args.prefix}-{k}", "Attune-Device": "bench", "Attune-Samples": "8"}
            try:
                status, response_headers, _ = await pool.request("PUT", f"/v1/models/{args.model}/users/{user}", headers,
                                                                 bodies[k % distinct])
            except Exception as error:
                status, response_headers = f"error:{type(error).__name__}", {}
            done = time.perf_counter()
            # The next upload of this user names what this one made (or, if refused, what the server holds).
            etags[user][j + 1].set_result(response_headers.get("etag", if_match))
            results.append((status, done - scheduled, waited - scheduled, done))
        await asyncio.gather(*(one(k) for k in range(total)))
        pool.close()
        return results, start, pool, opened_for_gets

    results, start, pool, opened_for_gets = asyncio.run(run())
    times = [seconds * 1000 for _, seconds, _, _ in results]
    statuses = {}
    for status, _, _, _ in results:
        statuses[str(status)] = statuses.get(str(status), 0) + 1
    span = max(done for _, _, _, done in results) - start
    late = max(lag for _, _, lag, _ in results) * 1000
    print(json.dumps({
        "label": args.label, "content": args.content, "rate": args.rate, "seconds": args.seconds, "users": args.users,
        "uploads": total, "achieved_rate": round(total / span, 1), "statuses": statuses,
        "p50_ms": round(percentile(times, 0.50), 2), "p90_ms": round(percentile(times, 0.90), 2),
        "p99_ms": round(percentile(times, 0.99), 2), "max_ms": round(max(times), 2),
        "body_bytes": len(bodies[0]), "connections": pool.opened, "new_connections": pool.opened - opened_for_gets,
        "peak_in_flight": pool.peak_busy,
        "generator_late_ms": round(late, 2),
    }))


# ---------------------------------------------------------------------------------------------------
# sizes

def sizes(args):
    data = open(args.model_file, "rb").read()
    net = sim.Network(data)
    state = net.state(net.params)
    raw = net.raw_parameter_bytes()
    print(json.dumps({"model": os.path.basename(args.model_file), "tensors": [n for n, _ in net.updatable],
                      "parameters": raw // 4, "raw_float32_bytes": raw, "state_bytes": len(state),
                      "state_over_raw": round(len(state) / raw, 4), "mlmodel_bytes": len(data),
                      "mlmodel_over_raw": round(len(data) / raw, 4)}))


# ---------------------------------------------------------------------------------------------------
# the two conflict policies

def policies(args):
    jwk = json.load(open(args.key_file))
    x, labels = sim.load_digits()
    base_net = sim.Network(open(sim.DIGITS_MODEL, "rb").read())
    for w in range(args.writers):
        first = 1200 + 100 * w
        held_x, held_l = x[first + 60:first + 100], labels[first + 60:first + 100]
        base_accuracy = sim.accuracy(base_net, base_net.params, held_x, held_l)
        for policy in ("retrain", "merge"):
            user = f"{args.prefix}-{policy}-w{w}"
            token = sim.sign_token(jwk, user)
            devices = [sim.Device(args.url, args.model, user, token, f"{policy}{d}",
                                  (x[first + 30 * d:first + 30 * d + 30], labels[first + 30 * d:first + 30 * d + 30]),
                                  policy=policy, seed=w * 10 + d) for d in range(2)]
            barrier = threading.Barrier(2)
            errors = []

            def run(device):
                try:
                    for r in range(args.rounds):
                        barrier.wait(timeout=60)
                        device.write_once(r)
                except Exception as error:
                    errors.append(f"{device.name}: {type(error).__name__}: {error}")
                    barrier.abort()
            threads = [threading.Thread(target=run, args=(d,)) for d in devices]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            final = sim.Device(args.url, args.model, user, token, "reader", (held_x, held_l))
            final.fetch()
            attempts = [at for d in devices for wr in d.writes for at in wr.attempts]
            print(json.dumps({
                "writer": w, "policy": policy, "rounds": args.rounds, "head": final.etag,
                "uploads_accepted": sum(1 for d in devices for wr in d.writes if wr.accepted is not None),
                "refused_412": sum(1 for at in attempts if at.status == 412),
                "merged": sum(d.counts["merged"] for d in devices), "puts": len(attempts),
                "unexpected": [u for d in devices for u in d.unexpected][:3] + errors[:3],
                "base_accuracy": round(base_accuracy, 4),
                "final_accuracy": round(sim.accuracy(final.net, final.params, held_x, held_l), 4),
                "held_out": len(held_x)}), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    lat = sub.add_parser("latency")
    lat.add_argument("--url", required=True)
    lat.add_argument("--key-file", required=True)
    lat.add_argument("--model", required=True)
    lat.add_argument("--rate", type=float, default=100)
    lat.add_argument("--seconds", type=float, default=20)
    lat.add_argument("--users", type=int, default=400)
    lat.add_argument("--prefix", required=True, help="names this run's users, so each starts at v0")
    lat.add_argument("--content", choices=("state", "mlmodel"), default="state")
    lat.add_argument("--label", default="attune")
    sz = sub.add_parser("sizes")
    sz.add_argument("--model-file", default=sim.DIGITS_MODEL)
    pol = sub.add_parser("policies")
    pol.add_argument("--url", required=True)
    pol.add_argument("--key-file", required=True)
    pol.add_argument("--model", required=True)
    pol.add_argument("--prefix", required=True)
    pol.add_argument("--writers", type=int, default=6)
    pol.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    {"latency": latency, "sizes": sizes, "policies": policies}[args.command](args)


if __name__ == "__main__":
    main()
