#!/usr/bin/env python3
"""Independent k-nearest-neighbours predictions for checking Attune's k-NN classifier.

Usage: reference_knn.py PROBLEM.json OUT.json      (or `-` for either to use stdin/stdout)

PROBLEM.json: {"stored": [[float]], "labels": [label per stored row], "queries": [[float]], "k": int,
               "weighting": "uniform" | "inverse_distance" | "inverse_squared_distance",
               "default_label": label (optional)}
OUT.json:     {"labels": [predicted label per query], "neighbours": [[stored row indices, nearest first]]}

Rules (a linear scan, distances in float64):
- Distance is Euclidean; the k nearest stored rows vote (all of them when fewer than k are stored);
  equal distances are ordered by stored index, the earlier row first.
- uniform: each neighbour's vote is 1. inverse_distance: each neighbour's vote is 1/d; a neighbour at
  distance 0 (an exact match) wins outright (the earliest such row when there are several).
  inverse_squared_distance (Core ML's: its index distance is the squared Euclidean one): each vote is
  1/d²; when any neighbour is an exact match, only the exact matches vote, 1 each.
- Tie between labels with the same total vote: the label of the nearest neighbour among the tied labels.
- No stored rows: default_label (null when not given).
Labels are returned as given (strings or integers).
"""
import json
import sys

import numpy as np


def nearest(stored, query, k):
    distances = np.sqrt(((stored - query) ** 2).sum(axis=1))
    order = np.lexsort((np.arange(len(stored)), distances))  # by distance, then by stored index
    return order[:k], distances


def predict_one(stored, labels, query, k, weighting):
    order, distances = nearest(stored, query, k)
    candidates = list(order)
    if weighting == "inverse_distance":
        exact = [i for i in order if distances[i] == 0]
        if exact:
            return labels[exact[0]], order
    if weighting == "inverse_squared_distance":
        # Core ML's index distance is the squared Euclidean one; exact matches, if any, vote alone, 1 each.
        exact = [i for i in order if distances[i] == 0]
        if exact:
            candidates = exact
    votes, first_rank = {}, {}
    for rank, i in enumerate(order):
        if i not in candidates:
            continue
        if weighting == "uniform" or distances[i] == 0:
            weight = 1.0
        elif weighting == "inverse_distance":
            weight = 1.0 / distances[i]
        else:
            weight = 1.0 / distances[i] ** 2
        key = json.dumps(labels[i])  # strings and integers stay distinct keys
        votes[key] = votes.get(key, 0.0) + weight
        first_rank.setdefault(key, rank)
    best = max(votes.values())
    # Equal votes: the label whose nearest member is nearest wins.
    winner = min((key for key, vote in votes.items() if vote == best), key=lambda key: first_rank[key])
    return json.loads(winner), order


def predict(problem):
    weighting = problem.get("weighting", "uniform")
    if weighting not in ("uniform", "inverse_distance", "inverse_squared_distance"):
        raise SystemExit(f"weighting must be uniform, inverse_distance or inverse_squared_distance, not {weighting!r}")
    k = int(problem["k"])
    if k < 1:
        raise SystemExit("k must be at least 1")
    labels = list(problem["labels"])
    stored = np.array(problem["stored"], dtype=np.float64)
    if len(stored) != len(labels):
        raise SystemExit(f"{len(stored)} stored rows but {len(labels)} labels")
    queries = np.array(problem["queries"], dtype=np.float64)
    predicted, neighbours = [], []
    for query in queries:
        if len(labels) == 0:
            predicted.append(problem.get("default_label"))
            neighbours.append([])
            continue
        if query.shape[0] != stored.shape[1]:
            raise SystemExit(f"a query has {query.shape[0]} values, the stored rows {stored.shape[1]}")
        label, order = predict_one(stored, labels, query, k, weighting)
        predicted.append(label)
        neighbours.append([int(i) for i in order])
    return {"labels": predicted, "neighbours": neighbours}


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    source = sys.stdin if sys.argv[1] == "-" else open(sys.argv[1])
    result = predict(json.load(source))
    if sys.argv[2] == "-":
        json.dump(result, sys.stdout)
    else:
        with open(sys.argv[2], "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
