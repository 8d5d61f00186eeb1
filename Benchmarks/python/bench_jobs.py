"""The fleet bench's jobs: the digits rows from the CSV, and JSON training jobs made of them for the users."""
import gzip
import json
import random

USERS = [f"user{u:02d}" for u in range(50)]
HOT_USERS = 3


def load_rows(path):
    with gzip.open(path, "rt") as f:
        rows = [line.strip().split(",") for line in f if line.strip()]
    return [([int(v) for v in r[:64]], r[64]) for r in rows]


def make_jobs(rows, tag, count, mix, seed, samples=20, epochs=10, users=USERS):
    """`count` JSON jobs (proto3 JSON of attune.v1.TrainingJob) of `samples` consecutive digits each."""
    rng = random.Random(seed)
    jobs = []
    for i in range(count):
        if mix == "hot" and rng.random() < 0.5:
            user = rng.choice(users[:HOT_USERS])
        else:
            user = rng.choice(users[HOT_USERS:] if mix == "hot" else users)
        start = rng.randrange(len(rows) - samples)
        chosen = [{"features": {"pixels": {"multiArray": {"shape": ["64"], "values": pixels}},
                                "digit": {"stringValue": label}}} for pixels, label in rows[start:start + samples]]
        job_id = f"{tag}-{i:06d}"
        body = json.dumps({"jobId": job_id, "userId": user, "model": "digits", "samples": chosen,
                           "parameters": {"epochs": str(epochs), "miniBatchSize": "8"}}).encode()
        jobs.append((job_id, user, body))
    return jobs
