#!/usr/bin/env python3
"""Independent NumPy reference for AttuneTraining's update task.

Reads a JSON problem (path in argv[1]) and writes the trained tensors as JSON (path in argv[2]).
Everything is computed in float64, so comparing with the Swift float32 engine checks the math, not the
rounding. The shuffle re-implements the documented SplitMix64 + Fisher-Yates rule of
Sources/AttuneTraining/Shuffle.swift; the optimizers are those of SGD.swift and Adam.swift:
    sgd:  v <- momentum * v - lr * g ;  w <- w + v   (v starts at zero)
    adam: m <- b1 m + (1 - b1) g ; v <- b2 v + (1 - b2) g^2 ; w <- w - lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
          (t counts mini-batch steps across epochs from 1; m and v start at zero)
The loss is the mean over the mini-batch of the per-sample loss: cross-entropy -log p[target] on the last
(softmax) layer, or mean squared error, the mean over the output's values of (y - t)^2.

Input JSON:
  layers: list of {"type": "dense", "name", "in", "out", "weights" (row-major [out][in]),
                   "bias" (or null), "trainable"} | {"type": "relu"} | {"type": "leaky_relu", "alpha"} |
                  {"type": "sigmoid"} | {"type": "tanh"} | {"type": "linear", "alpha", "beta"} |
                  {"type": "flatten"} | {"type": "softmax"}   (the last layer is the softmax fed to the loss)
  inputs: [[float]], targets: [int] (cross_entropy) or [[float]] of the output's width (mse),
  loss: "cross_entropy" (default) | "mse", optimizer: "sgd" (default; momentum) | "adam" (beta1, beta2, eps),
  epochs, learning_rate, mini_batch_size, shuffle, seed
  forward_only: true to run the network once and write {"outputs": [[float]]} instead of training
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


def loss_and_grads(layers, x, t, loss="cross_entropy"):
    """Per-sample losses of the batch and the gradient of the mean loss for every dense layer's parameters."""
    acts = forward(layers, x)
    batch = x.shape[0]
    if loss == "mse":
        y = acts[-1].reshape(batch, -1)
        diff = y - t
        losses = (diff ** 2).mean(axis=1)
        # Gradient w.r.t. the network output; back-propagation starts at the last layer.
        d = (2.0 * diff / (batch * y.shape[1])).reshape(acts[-1].shape)
        start = len(layers) - 1
    elif loss == "cross_entropy":
        logits = acts[-2]
        m = logits.max(axis=1, keepdims=True)
        logsumexp = m[:, 0] + np.log(np.exp(logits - m).sum(axis=1))
        losses = logsumexp - logits[np.arange(batch), t]
        onehot = np.zeros_like(logits)
        onehot[np.arange(batch), t] = 1.0
        # Gradient w.r.t. the softmax input (softmax + cross-entropy); the softmax itself is skipped.
        d = (acts[-1] - onehot) / batch
        start = len(layers) - 2
    else:
        raise SystemExit(f"unknown loss {loss}")
    grads = {}
    for i in range(start, -1, -1):
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


class SGD:
    def __init__(self, problem):
        self.lr, self.momentum = problem["learning_rate"], problem.get("momentum", 0.0)
        self.velocity = {}

    def step(self, key, w, g):
        v = self.velocity.setdefault(key, np.zeros_like(w))
        v *= self.momentum
        v -= self.lr * g
        w += v


class Adam:
    def __init__(self, problem):
        self.lr = problem["learning_rate"]
        self.beta1, self.beta2, self.eps = problem["beta1"], problem["beta2"], problem["eps"]
        self.moments = {}
        self.t = 0

    def next_step(self):
        self.t += 1

    def step(self, key, w, g):
        m, v = self.moments.setdefault(key, (np.zeros_like(w), np.zeros_like(w)))
        m *= self.beta1
        m += (1 - self.beta1) * g
        v *= self.beta2
        v += (1 - self.beta2) * g * g
        m_hat = m / (1 - self.beta1 ** self.t)
        v_hat = v / (1 - self.beta2 ** self.t)
        w -= self.lr * m_hat / (np.sqrt(v_hat) + self.eps)


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
    if problem.get("forward_only"):
        out = forward(layers, x_all)[-1].reshape(len(x_all), -1)
        json.dump({"outputs": out.tolist()}, open(sys.argv[2], "w"))
        return
    loss = problem.get("loss", "cross_entropy")
    t_all = np.array(problem["targets"], dtype=np.float64 if loss == "mse" else np.int64)
    n = len(t_all)
    batch_size = problem["mini_batch_size"]
    optimizer = {"sgd": SGD, "adam": Adam}[problem.get("optimizer", "sgd")](problem)
    trainable = [i for i, l in enumerate(layers) if l["type"] == "dense" and l["trainable"]]
    rng = SplitMix64(problem["seed"])
    order = list(range(n))
    epoch_losses = []
    for _ in range(problem["epochs"]):
        if problem["shuffle"]:
            shuffle_in_place(order, rng)
        total = 0.0
        for start in range(0, n, batch_size):
            idx = order[start:start + batch_size]
            losses, grads = loss_and_grads(layers, x_all[idx], t_all[idx], loss)
            total += losses.sum()
            if hasattr(optimizer, "next_step"):
                optimizer.next_step()
            for i in trainable:
                gw, gb = grads[i]
                optimizer.step((i, "W"), layers[i]["W"], gw)
                if layers[i]["b"] is not None:
                    optimizer.step((i, "b"), layers[i]["b"], gb)
        epoch_losses.append(total / n)
    tensors = {}
    for i in trainable:
        tensors[layers[i]["name"] + ".weights"] = layers[i]["W"].reshape(-1).tolist()
        if layers[i]["b"] is not None:
            tensors[layers[i]["name"] + ".bias"] = layers[i]["b"].tolist()
    json.dump({"tensors": tensors, "epoch_losses": epoch_losses}, open(sys.argv[2], "w"))


if __name__ == "__main__":
    main()
