#!/usr/bin/env python3
"""Independent NumPy reference for AttuneTraining's update task.

Reads a JSON problem (path in argv[1]) and writes the trained tensors as JSON (path in argv[2]).
Everything is computed in float64, so comparing with the Swift float32 engine checks the math, not the
rounding. The shuffle re-implements the documented SplitMix64 + Fisher-Yates rule of
Sources/AttuneTraining/Shuffle.swift; the optimizer is SGD with momentum as in SGD.swift:
    v <- momentum * v - lr * g ;  w <- w + v   (v starts at zero)

Input JSON:
  layers: list of {"type": "dense", "name", "in", "out", "weights" (row-major [out][in]),
                   "bias" (or null), "trainable"} | {"type": "relu"} | {"type": "leaky_relu", "alpha"} |
                  {"type": "sigmoid"} | {"type": "tanh"} | {"type": "linear", "alpha", "beta"} |
                  {"type": "flatten"} | {"type": "softmax"}   (the last layer is the softmax fed to the loss)
  inputs: [[float]], targets: [int], epochs, learning_rate, mini_batch_size, momentum, shuffle, seed
Output JSON: {"tensors": {"<layer>.weights": [...], "<layer>.bias": [...]}, "epoch_losses": [...]}
"""
import json
import sys

import numpy as np

MASK = (1 << 64) - 1


class SplitMix64:
    def __init__(self, seed):
        self.state = seed & MASK

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)


def shuffle_in_place(order, rng):
    for i in range(len(order) - 1, 0, -1):
        j = rng.next() % (i + 1)
        order[i], order[j] = order[j], order[i]


def forward(layers, x):
    """Returns the list of activations a[0] = x, a[i+1] = layer_i(a[i]); the last is the probabilities."""
    acts = [x]
    for layer in layers:
        a = acts[-1]
        t = layer["type"]
        if t == "dense":
            y = a @ layer["W"].T
            if layer["b"] is not None:
                y = y + layer["b"]
        elif t == "relu":
            y = np.where(a > 0, a, 0.0)
        elif t == "leaky_relu":
            y = np.where(a >= 0, a, layer["alpha"] * a)
        elif t == "sigmoid":
            y = 1.0 / (1.0 + np.exp(-a))
        elif t == "tanh":
            y = np.tanh(a)
        elif t == "linear":
            y = layer["alpha"] * a + layer["beta"]
        elif t == "flatten":
            y = a.reshape(a.shape[0], -1)
        elif t == "softmax":
            e = np.exp(a - a.max(axis=1, keepdims=True))
            y = e / e.sum(axis=1, keepdims=True)
        else:
            raise SystemExit(f"unknown layer type {t}")
        acts.append(y)
    return acts


def loss_and_grads(layers, x, t):
    """Mean cross-entropy of the batch and the gradient of every dense layer's parameters."""
    acts = forward(layers, x)
    logits = acts[-2]
    m = logits.max(axis=1, keepdims=True)
    logsumexp = m[:, 0] + np.log(np.exp(logits - m).sum(axis=1))
    batch = x.shape[0]
    losses = logsumexp - logits[np.arange(batch), t]
    onehot = np.zeros_like(logits)
    onehot[np.arange(batch), t] = 1.0
    # Gradient w.r.t. the softmax input (softmax + cross-entropy).
    d = (acts[-1] - onehot) / batch
    grads = {}
    for i in range(len(layers) - 2, -1, -1):
        layer, a_in, a_out = layers[i], acts[i], acts[i + 1]
        typ = layer["type"]
        if typ == "dense":
            grads[i] = (d.T @ a_in, d.sum(axis=0) if layer["b"] is not None else None)
            d = d @ layer["W"]
        elif typ == "relu":
            d = d * (a_in > 0)
        elif typ == "leaky_relu":
            d = np.where(a_in >= 0, d, layer["alpha"] * d)
        elif typ == "sigmoid":
            d = d * a_out * (1 - a_out)
        elif typ == "tanh":
            d = d * (1 - a_out ** 2)
        elif typ == "linear":
            d = d * layer["alpha"]
        elif typ == "flatten":
            d = d.reshape(a_in.shape)
        elif typ == "softmax":
            d = a_out * (d - (d * a_out).sum(axis=1, keepdims=True))
    return losses, grads


def main():
    problem = json.load(open(sys.argv[1]))
    layers = []
    for spec in problem["layers"]:
        layer = dict(spec)
        if spec["type"] == "dense":
            layer["W"] = np.array(spec["weights"], dtype=np.float64).reshape(spec["out"], spec["in"])
            layer["b"] = None if spec.get("bias") is None else np.array(spec["bias"], dtype=np.float64)
        layers.append(layer)
    x_all = np.array(problem["inputs"], dtype=np.float64)
    t_all = np.array(problem["targets"], dtype=np.int64)
    n = len(t_all)
    lr, momentum = problem["learning_rate"], problem["momentum"]
    batch_size = problem["mini_batch_size"]
    velocity = {i: (np.zeros_like(l["W"]), None if l["b"] is None else np.zeros_like(l["b"]))
                for i, l in enumerate(layers) if l["type"] == "dense" and l["trainable"]}
    rng = SplitMix64(problem["seed"])
    order = list(range(n))
    epoch_losses = []
    for _ in range(problem["epochs"]):
        if problem["shuffle"]:
            shuffle_in_place(order, rng)
        total = 0.0
        for start in range(0, n, batch_size):
            idx = order[start:start + batch_size]
            losses, grads = loss_and_grads(layers, x_all[idx], t_all[idx])
            total += losses.sum()
            for i, (vw, vb) in velocity.items():
                gw, gb = grads[i]
                vw *= momentum
                vw -= lr * gw
                layers[i]["W"] += vw
                if vb is not None:
                    vb *= momentum
                    vb -= lr * gb
                    layers[i]["b"] += vb
        epoch_losses.append(total / n)
    tensors = {}
    for i in velocity:
        tensors[layers[i]["name"] + ".weights"] = layers[i]["W"].reshape(-1).tolist()
        if layers[i]["b"] is not None:
            tensors[layers[i]["name"] + ".bias"] = layers[i]["b"].tolist()
    json.dump({"tensors": tensors, "epoch_losses": epoch_losses}, open(sys.argv[2], "w"))


if __name__ == "__main__":
    main()
