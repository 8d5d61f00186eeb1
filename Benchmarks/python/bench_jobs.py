"""The fleet bench's jobs: the digits rows from the CSV (or those rows drawn 28x28 for the 784-input net), and
JSON training jobs made of them for the users."""
import functools
import gzip
import json
import random

USERS = [f"user{u:02d}" for u in range(50)]
HOT_USERS = 3


def load_rows(path):
    with gzip.open(path, "rt") as f:
        rows = [line.strip().split(",") for line in f if line.strip()]
    return [([int(v) for v in r[:64]], r[64]) for r in rows]


def upsampled_rows(rows):
    """The digits drawn 28x28 as MNIST's are: each 8x8 pixel becomes a 3x3 block of a 24x24 image, framed by
    2 blank pixels on every side, scaled from 0..16 to 0..1 (blanks written as 0). A tuple per row, so that
    its encoding is computed once (`_sample_json`)."""
    out = []
    for pixels, label in rows:
        image = [0] * (28 * 28)
        for r in range(8):
            for c in range(8):
                v = pixels[8 * r + c]
                if v:
                    for dr in range(3):
                        start = (2 + 3 * r + dr) * 28 + 2 + 3 * c
                        image[start:start + 3] = [v / 16] * 3
        out.append((tuple(image), label))
    return out


@functools.lru_cache(maxsize=None)
def _sample_json(pixels, label):
    """One sample as JSON (json.dumps' default separators, as the job around it)."""
    return json.dumps({"features": {"pixels": {"multiArray": {"shape": [str(len(pixels))], "values": pixels}},
                                    "digit": {"stringValue": label}}})


def make_jobs(rows, tag, count, mix, seed, samples=20, epochs=10, users=USERS, model="digits", mini_batch=8):
    """`count` JSON jobs (proto3 JSON of attune.v1.TrainingJob) of `samples` consecutive rows each for
    `model` (the width of its input is the rows')."""
    rng = random.Random(seed)
    parameters = json.dumps({"epochs": str(epochs), "miniBatchSize": str(mini_batch)})
    jobs = []
    for i in range(count):
        if mix == "hot" and rng.random() < 0.5:
            user = rng.choice(users[:HOT_USERS])
        else:
            user = rng.choice(users[HOT_USERS:] if mix == "hot" else users)
        start = rng.randrange(len(rows) - samples)
        chosen = ", ".join(_sample_json(tuple(pixels), label) for pixels, label in rows[start:start + samples])
        job_id = f"{tag}-{i:06d}"
        # The same bytes as json.dumps of the whole job, without encoding each sample again.
        head = json.dumps({"jobId": job_id, "userId": user, "model": model})[:-1]
        body = f'{head}, "samples": [{chosen}], "parameters": {parameters}}}'.encode()
        jobs.append((job_id, user, body))
    return jobs
