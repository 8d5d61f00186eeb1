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
                | {"type": "conv", "name", "in_channels", "out_channels", "kernel": [kh, kw], "stride": [sh, sw],
                   "padding": "valid"|"same", "weights" (row-major [out][in][kh][kw]), "bias" (or null), "trainable"}
                | {"type": "pool", "name", "mode": "max"|"avg", "kernel", "stride", "padding", "exclude_padding"}
                | {"type": "batchnorm", "name", "channels", "gamma", "beta", "mean", "variance", "epsilon"}
                | {"type": "reshape", "name", "shape": [C, H, W] or [C]}
  input_shape: [C] or [C, H, W] (default [width]); inputs: [[float]] (row-major CHW per sample),
  targets: [int] (cross_entropy) or [[float]] of the output's width (mse),
  loss: "cross_entropy" (default) | "mse", optimizer: "sgd" (default; momentum) | "adam" (beta1, beta2, eps),
  epochs, learning_rate, mini_batch_size, shuffle, seed,
  learning_rate_schedule (optional, one rule): {"values": [lr per epoch]} | {"step_factor", "step_epochs"}
                  (epoch e, from 0, runs at learning_rate * step_factor ** (e // step_epochs)) |
                  {"exponential_decay"} (learning_rate * exponential_decay ** e); the optimizer's rate is set
                  before each epoch, its velocity or moments and t carry on
  forward_only: true to run the network once and write {"outputs": [[float]]} instead of training
  validation_inputs, validation_targets (optional, as inputs and targets), validation_classes (optional,
                  each validation sample's class): held-out samples evaluated after every epoch with that
                  epoch's weights: the mean of the same per-sample loss, and the fraction whose largest output
                  is their class, with the smallest gap between a sample's two largest outputs (how close a
                  prediction came to flipping)
Spatial layers follow Core ML: valid: out = floor((in - k) / s) + 1; same: out = ceil(in / s) with total
padding max((out - 1) * s + k - in, 0), floor(half) before and the rest after. Max pooling ignores padded
cells; average pooling divides by the in-image cells (exclude_padding) or by kh * kw.
Output JSON: {"tensors": {"<layer>.weights": [...], "<layer>.bias": [...]}, "epoch_losses": [...]}, plus
  with a validation set "validation_losses", "validation_accuracies" and "validation_margins" (one per epoch)
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


def window_geometry(size, kernel, stride, padding):
    """Output size and (before, after) padding of one spatial axis."""
    if padding == "valid":
        return (size - kernel) // stride + 1, 0, 0
    out = -(-size // stride)
    total = max((out - 1) * stride + kernel - size, 0)
    return out, total // 2, total - total // 2


def padded(a, layer, value):
    """a [N, C, H, W] with the layer's padding filled with `value`, and the output size."""
    (kh, kw), (sh, sw) = layer["kernel"], layer["stride"]
    oh, top, bottom = window_geometry(a.shape[2], kh, sh, layer["padding"])
    ow, left, right = window_geometry(a.shape[3], kw, sw, layer["padding"])
    return np.pad(a, ((0, 0), (0, 0), (top, bottom), (left, right)), constant_values=value), oh, ow, top, left


def windows(layer, oh, ow):
    """The (row slice, column slice) of every output cell's window in the padded input."""
    (kh, kw), (sh, sw) = layer["kernel"], layer["stride"]
    for r in range(oh):
        for c in range(ow):
            yield r, c, slice(r * sh, r * sh + kh), slice(c * sw, c * sw + kw)


def conv_forward(layer, a):
    """Sum over kernel offsets (i, j) of W[:, :, i, j] applied to the strided input shifted by (i, j)."""
    xp, oh, ow, _, _ = padded(a, layer, 0.0)
    (kh, kw), (sh, sw) = layer["kernel"], layer["stride"]
    y = np.zeros((a.shape[0], layer["W"].shape[0], oh, ow))
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, :, i:i + sh * (oh - 1) + 1:sh, j:j + sw * (ow - 1) + 1:sw]
            y += np.einsum("nchw,oc->nohw", patch, layer["W"][:, :, i, j])
    if layer["b"] is not None:
        y += layer["b"][None, :, None, None]
    return y


def conv_backward(layer, a_in, d):
    xp, oh, ow, top, left = padded(a_in, layer, 0.0)
    (kh, kw), (sh, sw) = layer["kernel"], layer["stride"]
    dw = np.zeros_like(layer["W"])
    dxp = np.zeros_like(xp)
    for i in range(kh):
        for j in range(kw):
            rows, cols = slice(i, i + sh * (oh - 1) + 1, sh), slice(j, j + sw * (ow - 1) + 1, sw)
            dw[:, :, i, j] = np.einsum("nohw,nchw->oc", d, xp[:, :, rows, cols])
            dxp[:, :, rows, cols] += np.einsum("nohw,oc->nchw", d, layer["W"][:, :, i, j])
    db = d.sum(axis=(0, 2, 3)) if layer["b"] is not None else None
    return dw, db, dxp[:, :, top:top + a_in.shape[2], left:left + a_in.shape[3]]


def pool_forward(layer, a):
    if layer["mode"] == "max":
        xp, oh, ow, _, _ = padded(a, layer, -np.inf)
        y = np.zeros(a.shape[:2] + (oh, ow))
        for r, c, rows, cols in windows(layer, oh, ow):
            y[:, :, r, c] = xp[:, :, rows, cols].max(axis=(2, 3))
        return y
    xp, oh, ow, _, _ = padded(a, layer, 0.0)
    inside, _, _, _, _ = padded(np.ones((1, 1) + a.shape[2:]), layer, 0.0)
    y = np.zeros(a.shape[:2] + (oh, ow))
    for r, c, rows, cols in windows(layer, oh, ow):
        count = inside[0, 0, rows, cols].sum() if layer["exclude_padding"] else layer["kernel"][0] * layer["kernel"][1]
        y[:, :, r, c] = xp[:, :, rows, cols].sum(axis=(2, 3)) / count
    return y


def pool_backward(layer, a_in, d):
    fill = -np.inf if layer["mode"] == "max" else 0.0
    xp, oh, ow, top, left = padded(a_in, layer, fill)
    inside, _, _, _, _ = padded(np.ones((1, 1) + a_in.shape[2:]), layer, 0.0)
    (kh, kw) = layer["kernel"]
    dxp = np.zeros_like(xp)
    n, ch = a_in.shape[:2]
    for r, c, rows, cols in windows(layer, oh, ow):
        if layer["mode"] == "max":
            # The first maximal cell in row-major order takes the whole gradient.
            flat = xp[:, :, rows, cols].reshape(n, ch, -1).argmax(axis=2)
            for k in range(n):
                for q in range(ch):
                    dxp[k, q, rows.start + flat[k, q] // kw, cols.start + flat[k, q] % kw] += d[k, q, r, c]
        else:
            count = inside[0, 0, rows, cols].sum() if layer["exclude_padding"] else kh * kw
            dxp[:, :, rows, cols] += d[:, :, r, c][:, :, None, None] / count
    return dxp[:, :, top:top + a_in.shape[2], left:left + a_in.shape[3]]


def channel_view(v, a):
    """A per-channel vector shaped to broadcast over a [N, C] or [N, C, H, W] batch."""
    return v.reshape((1, -1) + (1,) * (a.ndim - 2))


def as_image(a):
    return a if a.ndim == 4 else a.reshape(a.shape[0], -1, 1, 1)


def forward(layers, x):
    """Returns the list of activations a[0] = x, a[i+1] = layer_i(a[i]); the last is the probabilities."""
    acts = [x]
    for layer in layers:
        a = acts[-1]
        t = layer["type"]
        if t == "dense":
            y = a.reshape(a.shape[0], -1) @ layer["W"].T
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
            a = a.reshape(a.shape[0], -1)
            e = np.exp(a - a.max(axis=1, keepdims=True))
            y = e / e.sum(axis=1, keepdims=True)
        elif t == "conv":
            y = conv_forward(layer, as_image(a))
        elif t == "pool":
            y = pool_forward(layer, as_image(a))
        elif t == "batchnorm":
            scale = layer["gamma"] / np.sqrt(layer["variance"] + layer["epsilon"])
            y = channel_view(scale, a) * (a - channel_view(layer["mean"], a)) + channel_view(layer["beta"], a)
        elif t == "reshape":
            y = a.reshape((a.shape[0],) + tuple(layer["shape"]))
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
            flat = a_in.reshape(a_in.shape[0], -1)
            grads[i] = (d.T @ flat, d.sum(axis=0) if layer["b"] is not None else None)
            d = (d @ layer["W"]).reshape(a_in.shape)
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
            d = (a_out * (d - (d * a_out).sum(axis=1, keepdims=True))).reshape(a_in.shape)
        elif typ == "conv":
            dw, db, dx = conv_backward(layer, as_image(a_in), d.reshape(a_out.shape))
            grads[i] = (dw, db)
            d = dx.reshape(a_in.shape)
        elif typ == "pool":
            d = pool_backward(layer, as_image(a_in), d.reshape(a_out.shape)).reshape(a_in.shape)
        elif typ == "batchnorm":
            d = d * channel_view(layer["gamma"] / np.sqrt(layer["variance"] + layer["epsilon"]), a_in)
        elif typ == "reshape":
            d = d.reshape(a_in.shape)
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


def epoch_learning_rate(problem, epoch):
    """The rate of `epoch` (counted from 0) under the problem's schedule, computed in closed form."""
    lr, schedule = problem["learning_rate"], problem.get("learning_rate_schedule")
    if schedule is None:
        return lr
    if "values" in schedule:
        return schedule["values"][epoch]
    if "step_factor" in schedule:
        return lr * schedule["step_factor"] ** (epoch // schedule["step_epochs"])
    return lr * schedule["exponential_decay"] ** epoch


def main():
    problem = json.load(open(sys.argv[1]))
    layers = []
    for spec in problem["layers"]:
        layer = dict(spec)
        if spec["type"] == "dense":
            layer["W"] = np.array(spec["weights"], dtype=np.float64).reshape(spec["out"], spec["in"])
            layer["b"] = None if spec.get("bias") is None else np.array(spec["bias"], dtype=np.float64)
        elif spec["type"] == "conv":
            shape = (spec["out_channels"], spec["in_channels"], spec["kernel"][0], spec["kernel"][1])
            layer["W"] = np.array(spec["weights"], dtype=np.float64).reshape(shape)
            layer["b"] = None if spec.get("bias") is None else np.array(spec["bias"], dtype=np.float64)
        elif spec["type"] == "batchnorm":
            for key in ("gamma", "beta", "mean", "variance"):
                layer[key] = np.array(spec[key], dtype=np.float64)
        layers.append(layer)
    x_all = np.array(problem["inputs"], dtype=np.float64)
    x_all = x_all.reshape((len(x_all),) + tuple(problem.get("input_shape", [x_all.shape[1]])))
    if problem.get("forward_only"):
        out = forward(layers, x_all)[-1].reshape(len(x_all), -1)
        json.dump({"outputs": out.tolist()}, open(sys.argv[2], "w"))
        return
    loss = problem.get("loss", "cross_entropy")
    t_all = np.array(problem["targets"], dtype=np.float64 if loss == "mse" else np.int64)
    n = len(t_all)
    batch_size = problem["mini_batch_size"]
    optimizer = {"sgd": SGD, "adam": Adam}[problem.get("optimizer", "sgd")](problem)
    trainable = [i for i, l in enumerate(layers) if l["type"] in ("dense", "conv") and l["trainable"]]
    rng = SplitMix64(problem["seed"])
    order = list(range(n))
    epoch_losses = []
    validation = {"validation_losses": [], "validation_accuracies": [], "validation_margins": []}
    if "validation_inputs" in problem:
        v_x = np.array(problem["validation_inputs"], dtype=np.float64)
        v_x = v_x.reshape((len(v_x),) + x_all.shape[1:])
        v_t = np.array(problem["validation_targets"], dtype=np.float64 if loss == "mse" else np.int64)
        v_classes = problem.get("validation_classes")
    for epoch in range(problem["epochs"]):
        optimizer.lr = epoch_learning_rate(problem, epoch)
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
        if "validation_inputs" in problem:
            v_losses, _ = loss_and_grads(layers, v_x, v_t, loss)
            validation["validation_losses"].append(float(v_losses.mean()))
            if v_classes is not None:
                out = forward(layers, v_x)[-1].reshape(len(v_x), -1)
                validation["validation_accuracies"].append(float((out.argmax(axis=1) == np.array(v_classes)).mean()))
                top = np.sort(out, axis=1)
                validation["validation_margins"].append(float((top[:, -1] - top[:, -2]).min()))
    tensors = {}
    for i in trainable:
        tensors[layers[i]["name"] + ".weights"] = layers[i]["W"].reshape(-1).tolist()
        if layers[i]["b"] is not None:
            tensors[layers[i]["name"] + ".bias"] = layers[i]["b"].tolist()
    result = {"tensors": tensors, "epoch_losses": epoch_losses}
    if "validation_inputs" in problem:
        result.update(validation)
    json.dump(result, open(sys.argv[2], "w"))


if __name__ == "__main__":
    main()
