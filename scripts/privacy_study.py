#!/usr/bin/env python3
"""The privacy study's helper (scripts/privacy-study.sh runs it; docs/privacy-study.md says what it measures).

    privacy_study.py population --users N --held-out-users H --seed S --dir DIR
    privacy_study.py publish --dir DIR --model M --url AMQP_URL
    privacy_study.py wait --dir DIR --model M --database-url URL [--timeout SECONDS]
    privacy_study.py pilot --dir DIR [--users 200]
    privacy_study.py noise --attune BIN --sample-rate Q --rounds T --delta D --epsilon E
    privacy_study.py table --results FILE [--out FILE]

The population: users who write the digits of examples/data/digits.csv.gz through a distortion of their own
(slant, scale, stroke thickness) drawn around a style the whole population shares and the pretrained base never
saw. The fleet's users write rows 0-1199, the rows the base was trained on, since distorted they are new inputs
and the base's own training set is the "public" pool a simulation can draw from; held-out users write rows
1200-1796, which neither the base nor any fleet user ever saw in any form, so a learned base cannot score on
them by having met the same strokes under another distortion.
"""
import argparse
import gzip
import json
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
DIGITS_CSV = os.path.join(ROOT, "examples", "data", "digits.csv.gz")
BASE_MODEL = os.path.join(ROOT, "examples", "models", "digits-pretrained.mlmodel")
# Tests/python/coreml_fixtures.py trains digits-pretrained on these rows (BASE_ROWS).
BASE_ROWS = (0, 1200)
# digits-pretrained's update defaults (coreml_fixtures.PRETRAINED_UPDATE): what each fleet job runs with.
UPDATE = dict(learning_rate=0.002, batch=8, momentum=0.9, epochs=10)
UPSAMPLE = 4


def load_digits():
    rows = np.loadtxt(gzip.open(DIGITS_CSV, "rt"), delimiter=",")
    return rows[:, :64], rows[:, 64].astype(np.int64)


def distort(images, slant, scale, thickness, shifts):
    """images (n, 8, 8) in 0-16 through one writer's hand, back to (n, 64) in 0-16.

    The 8x8 grid is too coarse to slant or thicken a stroke by a fraction of a pixel, so each image is resampled
    on a grid UPSAMPLE times finer (bilinear), the stroke is grown or shrunk there by a grey-level dilation or
    erosion of radius `thickness` fine pixels (fractional radii blend the two neighbouring whole ones), and
    the fine grid is averaged back down to 8x8, as the digits set itself was made from 32x32 bitmaps.
    Slant is a shear about the centre (positive leans the top to the right); scale shrinks (< 1) or grows it;
    shifts (n, 2) moves each image by (rows, columns) of the 8x8 grid.
    """
    n = len(images)
    fine = 8 * UPSAMPLE
    centre = 3.5
    slant, scale = (np.broadcast_to(np.asarray(v, dtype=np.float64), (n,))[:, None, None] for v in (slant, scale))
    thickness = np.broadcast_to(np.asarray(thickness, dtype=np.float64), (n,))
    coords = (np.arange(fine) + 0.5) / UPSAMPLE - 0.5
    yy = coords[None, :, None] - shifts[:, 0, None, None]
    xx = coords[None, None, :] - shifts[:, 1, None, None]
    # Inverse map: for every fine output pixel, where it comes from in the writer-free image.
    ys = centre + (yy - centre) / scale
    xs = centre + (xx - centre) / scale - slant * (centre - ys)
    ys, xs = np.broadcast_arrays(ys, xs)
    y0, x0 = np.floor(ys).astype(int), np.floor(xs).astype(int)
    fy, fx = ys - y0, xs - x0
    which = np.arange(n)[:, None, None]

    def at(yi, xi):
        inside = (yi >= 0) & (yi < 8) & (xi >= 0) & (xi < 8)
        return images[which, np.clip(yi, 0, 7), np.clip(xi, 0, 7)] * inside

    out = (at(y0, x0) * (1 - fy) * (1 - fx) + at(y0, x0 + 1) * (1 - fy) * fx
           + at(y0 + 1, x0) * fy * (1 - fx) + at(y0 + 1, x0 + 1) * fy * fx)

    def morph(a, radius):
        r = abs(radius)
        if r == 0:
            return a
        result = a.copy()
        padded = np.pad(a, ((0, 0), (r, r), (r, r)))
        pick = np.maximum if radius > 0 else np.minimum
        for dy in range(-r, r + 1):
            for dx in range(-r, r + 1):
                if dy * dy + dx * dx <= r * r:
                    result = pick(result, padded[:, r + dy:r + dy + fine, r + dx:r + dx + fine])
        return result

    low = np.floor(thickness).astype(int)
    frac = (thickness - low)[:, None, None]
    blend = np.zeros_like(out)
    for radius in np.unique(np.concatenate([low, low + 1])):
        # Each whole radius once, over the images that need it as the lower or the upper end of their blend.
        lower, upper = low == radius, low + 1 == radius
        needed = lower | upper
        weight = np.where(lower, 1 - frac[:, 0, 0], frac[:, 0, 0])[needed, None, None]
        blend[needed] += weight * morph(out[needed], int(radius))
    out = blend
    return np.clip(out.reshape(n, 8, UPSAMPLE, 8, UPSAMPLE).mean(axis=(2, 4)), 0, 16).reshape(n, 64)


class Population:
    """Writers drawn around a shared style; every draw comes from one generator per purpose, so a population is
    a function of (seed, sizes, style) alone."""

    def __init__(self, args):
        self.style = dict(slant=args.slant, scale=args.scale, thickness=args.thickness)
        self.spread = dict(slant=args.slant_spread, scale=args.scale_spread, thickness=args.thickness_spread)
        self.samples = (args.samples_min, args.samples_max)
        self.pixels, self.digits = load_digits()

    def writer(self, rng):
        return dict(slant=float(rng.normal(self.style["slant"], self.spread["slant"])),
                    scale=float(np.clip(rng.normal(self.style["scale"], self.spread["scale"]), 0.6, 1.25)),
                    thickness=float(rng.normal(self.style["thickness"], self.spread["thickness"])))

    def user(self, rng, rows, count=None):
        """One writer's draws: their hand, `count` (default: uniform in the sample range) rows of `rows`, and a
        shift of up to a third of a pixel per sample, since no one puts a digit at the same spot twice."""
        hand = self.writer(rng)
        count = count or int(rng.integers(self.samples[0], self.samples[1] + 1))
        picked = rng.choice(rows, size=count, replace=False)
        return hand, picked, rng.uniform(-1 / 3, 1 / 3, (count, 2))

    def write(self, users, chunk=4096):
        """The users' samples (pixels rounded to 2 decimals, as they go into the jobs) and labels, distorted in
        chunks of samples: one NumPy pass per chunk rather than per user."""
        per_sample = {key: np.concatenate([np.full(len(picked), hand[key]) for hand, picked, _ in users])
                      for key in ("slant", "scale", "thickness")}
        rows = np.concatenate([picked for _, picked, _ in users])
        shifts = np.concatenate([shift for _, _, shift in users])
        out = np.empty((len(rows), 64))
        for a in range(0, len(rows), chunk):
            b = min(a + chunk, len(rows))
            out[a:b] = distort(self.pixels[rows[a:b]].reshape(-1, 8, 8), shifts=shifts[a:b],
                               **{key: values[a:b] for key, values in per_sample.items()})
        return np.round(out, 2), self.digits[rows]


def population(args):
    os.makedirs(args.dir, exist_ok=True)
    pop = Population(args)
    fleet_rows = np.arange(*BASE_ROWS)
    held_rows = np.arange(BASE_ROWS[1], len(pop.digits))
    # Separate streams: adding held-out users (or pilot users) never changes the fleet's users.
    fleet_rng, held_rng = (np.random.default_rng([args.seed, k]) for k in (1, 2))
    started = time.time()
    fleet = [pop.user(fleet_rng, fleet_rows) for _ in range(args.users)]
    pixels, digits = pop.write(fleet)
    counts = np.array([len(picked) for _, picked, _ in fleet])
    np.savez_compressed(os.path.join(args.dir, "fleet.npz"), pixels=pixels.astype(np.float32), digits=digits,
                        counts=counts)
    held_x, held_y = pop.write([pop.user(held_rng, held_rows, count=args.held_out_samples)
                                for _ in range(args.held_out_users)])
    with open(os.path.join(args.dir, "held-out.csv"), "w") as f:
        for x, y in zip(held_x, held_y):
            f.write(",".join(f"{v:g}" for v in x) + f",{y}\n")
    hands = [hand for hand, _, _ in fleet]
    summary = {
        "seed": args.seed, "users": args.users, "held_out_users": args.held_out_users,
        "held_out_samples_per_user": args.held_out_samples, "held_out_samples": int(len(held_y)),
        "fleet_samples": int(sum(counts)), "samples_per_user": list(pop.samples),
        "style": pop.style, "spread": pop.spread,
        "fleet_rows": list(BASE_ROWS), "held_out_rows": [BASE_ROWS[1], int(len(pop.digits))],
        "fleet_writers_mean": {k: float(np.mean([h[k] for h in hands])) for k in pop.style},
        "seconds": round(time.time() - started, 2),
    }
    with open(os.path.join(args.dir, "population.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps(summary))


def user_id(k):
    return f"u{k:06d}"


def jobs(args):
    """(job id, user id, JSON body) for every fleet user: one job each, with their samples."""
    data = np.load(os.path.join(args.dir, "fleet.npz"))
    # Pixels are hundredths from 0 to 16: 1,601 values, each printed once here and looked up after, since
    # printing 11 million floats one by one is most of a 5,000-user publish.
    hundredths = np.rint(data["pixels"].astype(np.float64) * 100).astype(np.int64)
    printed = np.array([json.dumps(k / 100) for k in range(int(hundredths.max()) + 1)], dtype=object)
    rows = [",".join(values) for values in printed[hundredths]]
    digits, counts = data["digits"].tolist(), data["counts"]
    offsets = np.concatenate([[0], np.cumsum(counts)])
    for k in range(len(counts)):
        samples = ",".join(f'{{"features": {{"pixels": {{"multiArray": {{"values": [{rows[i]}]}}}}, '
                           f'"digit": {{"stringValue": "{digits[i]}"}}}}}}' for i in range(offsets[k], offsets[k + 1]))
        # No parameters: each user trains with the model's own update defaults, as an app's users would.
        job_id = f"{args.model}-{user_id(k)}-1"
        yield job_id, user_id(k), (f'{{"jobId": "{job_id}", "userId": "{user_id(k)}", "model": "{args.model}", '
                                   f'"samples": [{samples}]}}').encode()


def publish(args):
    """Every job with publisher confirms, as examples/python/producer.py publishes one, but with up to --window
    unconfirmed at a time: waiting for each confirm (a quorum queue's write to disk) before the next publish
    takes tens of milliseconds a job, minutes for the fleet."""
    import pika
    pending = jobs(args)
    state = {"unconfirmed": set(), "tag": 0, "sent": 0, "confirmed": 0, "done": False, "problems": []}
    started = time.time()

    def send(channel):
        while len(state["unconfirmed"]) < args.window and not state["done"]:
            job = next(pending, None)
            if job is None:
                state["done"] = True
                break
            job_id, user, body = job
            channel.basic_publish(
                exchange="attune.jobs", routing_key=user, body=body, mandatory=True,
                properties=pika.BasicProperties(content_type="application/json", message_id=job_id,
                                                delivery_mode=pika.DeliveryMode.Persistent))
            state["tag"] += 1
            state["sent"] += 1
            state["unconfirmed"].add(state["tag"])
        if state["done"] and not state["unconfirmed"]:
            channel.connection.close()

    def on_confirm(frame):
        method = frame.method
        if isinstance(method, pika.spec.Basic.Nack):
            state["problems"].append(f"the broker refused delivery {method.delivery_tag} (nack)")
        tags = ({t for t in state["unconfirmed"] if t <= method.delivery_tag} if method.multiple
                else {method.delivery_tag})
        state["unconfirmed"] -= tags
        state["confirmed"] += len(tags)
        send(channel_holder[0])

    def on_return(_channel, _method, properties, _body):
        state["problems"].append(f"job {properties.message_id} was unroutable: run `attune topology declare`")

    channel_holder = []

    def on_channel(channel):
        channel_holder.append(channel)
        channel.add_on_return_callback(on_return)
        channel.confirm_delivery(on_confirm, callback=lambda _frame: send(channel))

    connection = pika.SelectConnection(
        pika.URLParameters(args.url),
        on_open_callback=lambda conn: conn.channel(on_open_callback=on_channel),
        on_open_error_callback=lambda _conn, error: state["problems"].append(f"cannot connect: {error}"),
        on_close_callback=lambda conn, _reason: conn.ioloop.stop())
    connection.ioloop.start()
    if state["problems"] or state["confirmed"] != state["sent"]:
        sys.exit(f"published {state['sent']}, confirmed {state['confirmed']}: " + "; ".join(state["problems"][:5]))
    import resource
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"published": state["confirmed"], "seconds": round(time.time() - started, 2),
                      "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 2)}))


def wait(args):
    import psycopg
    expected = int(len(np.load(os.path.join(args.dir, "fleet.npz"))["counts"]))
    deadline = time.time() + args.timeout
    last_report = 0.0
    with psycopg.connect(args.database_url, autocommit=True) as db:
        while True:
            counts = dict(db.execute(
                "SELECT state, count(*) FROM attune_job_outcomes WHERE model = %s GROUP BY state",
                (args.model,)).fetchall())
            done = counts.get("completed", 0)
            if counts.get("failed", 0):
                reason = db.execute("SELECT job_id, reason FROM attune_job_outcomes WHERE model = %s AND "
                                    "state = 'failed' LIMIT 1", (args.model,)).fetchone()
                sys.exit(f"{counts['failed']} job(s) failed, e.g. {reason[0]}: {reason[1]}")
            if done >= expected:
                print(json.dumps({"completed": done}))
                return
            if time.time() > deadline:
                sys.exit(f"only {done} of {expected} jobs completed within {args.timeout} s: {counts}")
            if time.time() - last_report > 15:
                print(f"  {done} of {expected} users trained", file=sys.stderr, flush=True)
                last_report = time.time()
            time.sleep(1)


def base_weights():
    """The pretrained base's four tensors, read from the .mlmodel (Core ML's protobuf, through coremltools)."""
    from coremltools.proto import Model_pb2
    model = Model_pb2.Model()
    with open(BASE_MODEL, "rb") as f:
        model.ParseFromString(f.read())
    layers = {layer.name: layer.innerProduct for layer in model.neuralNetworkClassifier.layers
              if layer.WhichOneof("layer") == "innerProduct"}

    def tensor(layer, shape):
        return (np.array(layer.weights.floatValue, dtype=np.float64).reshape(shape),
                np.array(layer.bias.floatValue, dtype=np.float64))
    w1, b1 = tensor(layers["hidden"], (32, 64))
    w2, b2 = tensor(layers["classes"], (10, 32))
    return [w1, b1, w2, b2]


def softmax_rows(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def train(weights, x, t, rng):
    """SGD with momentum as the engine runs the model's defaults (float64; its own shuffle, not the engine's)."""
    params = [w.copy() for w in weights]
    velocity = [np.zeros_like(p) for p in params]
    for _ in range(UPDATE["epochs"]):
        order = rng.permutation(len(t))
        for start in range(0, len(t), UPDATE["batch"]):
            idx = order[start:start + UPDATE["batch"]]
            w1, b1, w2, b2 = params
            pre = x[idx] @ w1.T + b1
            act = np.maximum(pre, 0)
            d = softmax_rows(act @ w2.T + b2)
            d[np.arange(len(idx)), t[idx]] -= 1
            d /= len(idx)
            d_act = (d @ w2) * (pre > 0)
            for v, g, p in zip(velocity, [d_act.T @ x[idx], d_act.sum(0), d.T @ act, d.sum(0)], params):
                v *= UPDATE["momentum"]
                v -= UPDATE["learning_rate"] * g
                p += v
    return params


def pilot(args):
    """The clipping norm S, from simulated writers of the same distribution who are not in the fleet.

    S must not be read off the fleet's own changes: a norm chosen from private data leaks through the choice,
    outside the accountant. A pilot population is what an operator would have from a public or consented set.
    Also prints what NumPy expects the non-private average to do, a check on the fleet's figure."""
    with open(os.path.join(args.dir, "population.json")) as f:
        summary = json.load(f)
    ns = argparse.Namespace(slant=summary["style"]["slant"], scale=summary["style"]["scale"],
                            thickness=summary["style"]["thickness"], slant_spread=summary["spread"]["slant"],
                            scale_spread=summary["spread"]["scale"], thickness_spread=summary["spread"]["thickness"],
                            samples_min=summary["samples_per_user"][0], samples_max=summary["samples_per_user"][1])
    pop = Population(ns)
    rng = np.random.default_rng([summary["seed"], 3])
    base = base_weights()
    changes = []
    for _ in range(args.users):
        x, y = pop.write([pop.user(rng, np.arange(*BASE_ROWS))])
        changes.append([p - b for p, b in zip(train(base, x, y, rng), base)])
    norms = np.array([np.sqrt(sum(float((c ** 2).sum()) for c in change)) for change in changes])
    mean = [np.mean([c[i] for c in changes], axis=0) for i in range(4)]
    held = np.loadtxt(os.path.join(args.dir, "held-out.csv"), delimiter=",")
    hx, hy = held[:, :64], held[:, 64].astype(int)

    def accuracy(w):
        return float(np.mean(softmax_rows(np.maximum(hx @ w[0].T + w[1], 0) @ w[2].T + w[3]).argmax(1) == hy))
    report = {"pilot_users": args.users, "parameters": int(sum(b.size for b in base)), "clip_norm": round(float(np.quantile(norms, args.quantile)), 4),
              "quantile": args.quantile, "norm_p10_p50_p90": [round(float(v), 4) for v in np.quantile(norms, [.1, .5, .9])],
              "mean_change_norm": round(float(np.sqrt(sum(float((m ** 2).sum()) for m in mean))), 4),
              "numpy_base_accuracy": accuracy(base),
              "numpy_pilot_average_accuracy": accuracy([b + m for b, m in zip(base, mean)])}
    print(json.dumps(report))


def epsilon(attune, q, z, rounds, delta):
    out = subprocess.run([attune, "privacy", "epsilon", "--sample-rate", repr(q), "--noise-multiplier", repr(z),
                          "--rounds", str(rounds), "--delta", repr(delta), "--format", "json"],
                         check=True, capture_output=True, text=True).stdout
    value = json.loads(out)["epsilon"]
    return float("inf") if value is None else float(value)


def noise(args):
    """The smallest z (to --tolerance) whose ε is at most the target: ε falls as z grows, so bisect."""
    low, high = 0.0, 1.0
    while epsilon(args.attune, args.sample_rate, high, args.rounds, args.delta) > args.epsilon:
        low, high = high, high * 2
        if high > 1e4:
            sys.exit(f"no z up to {high} reaches ε = {args.epsilon}")
    while high - low > args.tolerance * high:
        mid = (low + high) / 2
        if epsilon(args.attune, args.sample_rate, mid, args.rounds, args.delta) > args.epsilon:
            low = mid
        else:
            high = mid
    # Rounded up to 4 significant digits, so the z passed on never gives more than the target ε.
    step = 10.0 ** (np.floor(np.log10(high)) - 3)
    z = float(f"{np.ceil(high / step) * step:.4g}")
    print(json.dumps({"noise_multiplier": z,
                      "epsilon": epsilon(args.attune, args.sample_rate, z, args.rounds, args.delta)}))


def table(args):
    """Markdown from the study's result lines (JSON, one per learn-base run or evaluation, from the shell)."""
    with open(args.results) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    meta = next(line for line in lines if line.get("kind") == "meta")
    base = next(line for line in lines if line.get("kind") == "base")
    runs = [line for line in lines if line.get("kind") == "run"]
    groups = {}
    for run in runs:
        groups.setdefault(run["row"], []).append(run)
    pilot = meta["pilot"]
    users = meta["users"]

    def spread(values, digits=4):
        values = [v for v in values if v is not None]
        if not values:
            return "–"
        if len(values) == 1:
            return f"{values[0]:.{digits}f}"
        return f"{np.mean(values):.{digits}f} ± {np.std(values, ddof=1):.{digits}f}"

    def noise_share(run):
        """The expected L2 norm of all the noise a run puts on the base, η·z·S·√(T·P)/(q·N) for P parameters,
        over the mean change's norm in the pilot: how much the noise weighs against what is being learned."""
        norm = (run["eta"] * run["z"] * run["clip_norm"] * np.sqrt(run["rounds"] * pilot["parameters"])
                / (run["q"] * users))
        return norm / pilot["mean_change_norm"]

    reference = groups.get("mean")
    private_gain = np.mean([r["accuracy"] for r in reference]) - base["accuracy"] if reference else None
    names = {"mean": "non-private average (every user, no clipping)", "inf": "no noise, private runs' q, T, S"}
    order = [row for row in ("mean", "inf") if row in groups] + sorted(
        (row for row in groups if row not in names), key=float, reverse=True)
    out = [f"Population: {users:,} fleet users ({meta['fleet_samples']:,} samples, "
           f"{meta['samples_per_user'][0]}–{meta['samples_per_user'][1]} each); held out: "
           f"{meta['held_out_users']} users never in the fleet, {meta['held_out_samples']:,} samples; "
           f"population seed {meta['seed']}, learn-base seeds {', '.join(str(s) for s in meta['run_seeds'])}.",
           f"Fleet: {users:,} jobs published in {meta['publish_seconds']:.1f} s, trained by {meta['workers']} "
           f"worker(s) in {meta['fleet_seconds']:.1f} s; binary {meta['binary']}.",
           f"Machine: {meta['machine']}.",
           f"S = {meta['clip_norm']} ({meta['clip_norm_source']}); pilot: mean change norm "
           f"{pilot['mean_change_norm']}, {pilot['parameters']} parameters; δ = {meta['delta']:.3g} per run "
           f"(1/N = {1 / users:.3g}).", "",
           "| run | N | q | T | S | η | z | ε at δ | accuracy | gain vs base | share of the non-private gain | "
           "noise on the base / mean change | changes clipped | learn-base wall time (s) | runs |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
           f"| original base | – | – | – | – | – | – | – | {base['accuracy']:.4f} | – | – | – | – | – | 1 |"]
    for row in order:
        group = groups[row]
        first = group[0]
        accuracies = [r["accuracy"] for r in group]
        gains = [a - base["accuracy"] for a in accuracies]
        kept = [g / private_gain for g in gains] if private_gain and row != "mean" else [None]
        eps = spread([r["epsilon"] for r in group], 3)
        if row in names:
            eps = f"∞ (z = {first['z']}: {np.mean([r['epsilon'] for r in group]):.3g})"
        clipped = [r["clipped"] / r["contributions"] for r in group if r.get("contributions")]
        out.append(f"| {names.get(row, f'ε = {row}')} | {users:,} | {first['q']} | {first['rounds']} | "
                   f"{first['clip_norm']:g} | {first['eta']:g} | {first['z']} | {eps} | {spread(accuracies)} | "
                   f"{spread(gains)} | {spread(kept, 2)} | {noise_share(first):.3f} | {spread(clipped, 2)} | "
                   f"{spread([r['seconds'] for r in group], 1)} | {len(group)} |")
    if private_gain is not None and private_gain <= 0:
        out += ["", f"The non-private average did not beat the original base (gain {private_gain:+.4f}): "
                    "the shares of it kept mean nothing here."]
    text = "\n".join(out) + "\n"
    print(text, end="")
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("population")
    p.add_argument("--dir", required=True)
    p.add_argument("--users", type=int, default=5000)
    p.add_argument("--held-out-users", type=int, default=200)
    p.add_argument("--held-out-samples", type=int, default=40)
    p.add_argument("--samples-min", type=int, default=30)
    p.add_argument("--samples-max", type=int, default=40)
    p.add_argument("--seed", type=int, default=1)
    # The population's shared style (what a learned base can pick up) and each writer's spread around it.
    # Slant: shear, top to the right; scale: size; thickness: stroke radius change in quarter pixels.
    p.add_argument("--slant", type=float, default=0.3)
    p.add_argument("--scale", type=float, default=0.9)
    p.add_argument("--thickness", type=float, default=1.0)
    p.add_argument("--slant-spread", type=float, default=0.15)
    p.add_argument("--scale-spread", type=float, default=0.07)
    p.add_argument("--thickness-spread", type=float, default=0.6)
    p = sub.add_parser("publish")
    p.add_argument("--dir", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--url", default=os.environ.get("ATTUNE_AMQP_URL"))
    p.add_argument("--window", type=int, default=500)
    p = sub.add_parser("wait")
    p.add_argument("--dir", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--database-url", default=os.environ.get("ATTUNE_DATABASE_URL"))
    p.add_argument("--timeout", type=float, default=3600)
    p = sub.add_parser("pilot")
    p.add_argument("--dir", required=True)
    p.add_argument("--users", type=int, default=200)
    p.add_argument("--quantile", type=float, default=0.5)
    p = sub.add_parser("noise")
    p.add_argument("--attune", required=True)
    p.add_argument("--sample-rate", type=float, required=True)
    p.add_argument("--rounds", type=int, required=True)
    p.add_argument("--delta", type=float, required=True)
    p.add_argument("--epsilon", type=float, required=True)
    p.add_argument("--tolerance", type=float, default=1e-4)
    p = sub.add_parser("table")
    p.add_argument("--results", required=True)
    p.add_argument("--out")
    args = parser.parse_args()
    {"population": population, "publish": publish, "wait": wait, "pilot": pilot, "noise": noise,
     "table": table}[args.command](args)


if __name__ == "__main__":
    main()
