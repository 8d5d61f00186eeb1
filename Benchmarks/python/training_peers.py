"""The peers Benchmarks/training.sh races Attune's update tasks against: the same dense nets, rows and
update rule written the way a Python developer would, in NumPy (float32, vectorized per mini-batch, NumPy's
own OpenBLAS) and in PyTorch on the CPU.

  python training_peers.py numpy FIXTURES --nets "file:epochs ..." --samples N
  python training_peers.py torch FIXTURES --nets "file:epochs ..." --samples N --threads T
  python training_peers.py table < lines        # the ratio table from every peer's lines

Each net is a coremltools file (Tests/python/coreml_fixtures.py: in -> dense -> ReLU -> dense(10) ->
softmax, categorical cross-entropy, SGD with momentum); its initial weights, learning rate and momentum are
read from the file, so all three start from the same point. The rows are the formula the Swift benchmark
uses (ThroughputBenchmarks.testDenseNetworksForPeers): x[i][j] = ((7919 i + 104729 j) mod 1009) / 1009,
label i mod 10. Mini-batches 8, 32 and 256 in file order (no shuffle); best of three tasks. Each peer prints
one line per net and mini-batch,

  peer NAME net=... batch=... samples=... epochs=... seconds=... loss=...

where loss is the last epoch's mean, which should agree across peers (same weights, rows and rule) to
float32 rounding: a check that the peers did the same work.
"""
import argparse
import os
import sys
import time

import numpy as np

MINI_BATCHES = (8, 32, 256)
REPEATS = 3


def rows(n, width):
    i = np.arange(n, dtype=np.int64)[:, None]
    j = np.arange(width, dtype=np.int64)[None, :]
    x = (((7919 * i + 104729 * j) % 1009) / 1009).astype(np.float32)
    return x, (np.arange(n) % 10).astype(np.int64)


def read_net(path):
    """(W1, b1, W2, b2, learning rate, momentum) of a two-dense-layer classifier, as float32."""
    from coremltools.proto import Model_pb2
    spec = Model_pb2.Model()
    with open(path, "rb") as f:
        spec.ParseFromString(f.read())
    nn = spec.neuralNetworkClassifier
    dense = [layer.innerProduct for layer in nn.layers if layer.WhichOneof("layer") == "innerProduct"]
    tensors = []
    for d in dense:
        tensors.append(np.array(d.weights.floatValue, dtype=np.float32).reshape(d.outputChannels, d.inputChannels))
        tensors.append(np.array(d.bias.floatValue, dtype=np.float32))
    sgd = nn.updateParams.optimizer.sgdOptimizer
    return (*tensors, sgd.learningRate.defaultValue, sgd.momentum.defaultValue)


def numpy_task(net, x, t, epochs, batch):
    """One update task: the loop a Python developer writes. Returns the last epoch's mean loss."""
    w1, b1, w2, b2, lr, momentum = net
    params = [w1.copy(), b1.copy(), w2.copy(), b2.copy()]
    velocity = [np.zeros_like(p) for p in params]
    lr, momentum = np.float32(lr), np.float32(momentum)
    n = len(x)
    for _ in range(epochs):
        total = 0.0
        for first in range(0, n, batch):
            xb, tb = x[first:first + batch], t[first:first + batch]
            rows_ = np.arange(len(xb))
            w1, b1, w2, b2 = params
            h = xb @ w1.T + b1
            a = np.maximum(h, 0)
            z = a @ w2.T + b2
            z = z - z.max(axis=1, keepdims=True)
            e = np.exp(z)
            p = e / e.sum(axis=1, keepdims=True)
            total += float(-np.log(p[rows_, tb]).sum())
            dz = p
            dz[rows_, tb] -= 1
            dz /= len(xb)
            dw2, db2 = dz.T @ a, dz.sum(axis=0)
            dh = (dz @ w2) * (h > 0)
            dw1, db1 = dh.T @ xb, dh.sum(axis=0)
            for param, v, g in zip(params, velocity, (dw1, db1, dw2, db2)):
                v *= momentum
                v -= lr * g
                param += v
        loss = total / n
    return loss


def torch_task(torch, net, x, t, epochs, batch):
    w1, b1, w2, b2, lr, momentum = net
    model = torch.nn.Sequential(torch.nn.Linear(w1.shape[1], w1.shape[0]), torch.nn.ReLU(),
                                torch.nn.Linear(w2.shape[1], w2.shape[0]))
    with torch.no_grad():
        for layer, w, b in ((model[0], w1, b1), (model[2], w2, b2)):
            layer.weight.copy_(torch.from_numpy(w))
            layer.bias.copy_(torch.from_numpy(b))
    # PyTorch's momentum (v <- m v + g; w <- w - lr v) equals Core ML's (v <- m v - lr g; w <- w + v) at a
    # constant learning rate.
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    criterion = torch.nn.CrossEntropyLoss()
    xs, ts = torch.from_numpy(x), torch.from_numpy(t)
    n = len(x)
    for _ in range(epochs):
        total = 0.0
        for first in range(0, n, batch):
            xb, tb = xs[first:first + batch], ts[first:first + batch]
            optimizer.zero_grad()
            loss = criterion(model(xb), tb)
            loss.backward()
            optimizer.step()
            total += loss.item() * len(xb)
        mean = total / n
    return mean


def run(peer, fixtures, nets, samples, threads):
    if peer == "numpy":
        from threadpoolctl import threadpool_info
        blas = [f"{p['internal_api']} {p['version']} {p['architecture']}, {p['num_threads']} thread(s)"
                for p in threadpool_info() if p["user_api"] == "blas"]
        print(f"peer numpy blas: numpy {np.__version__}, {'; '.join(blas) or 'no BLAS found'}", flush=True)
        task = numpy_task
    else:
        import torch
        torch.set_num_threads(threads)
        print(f"peer torch blas: torch {torch.__version__}, {torch.get_num_threads()} thread(s)", flush=True)
        task = lambda *a: torch_task(torch, *a)  # noqa: E731
    for item in nets.split():
        file, epochs = item.split(":")
        net = read_net(os.path.join(fixtures, file))
        x, t = rows(samples, net[0].shape[1])
        for batch in MINI_BATCHES:
            best, loss = float("inf"), None
            for _ in range(REPEATS):
                start = time.perf_counter()
                loss = task(net, x, t, int(epochs), batch)
                best = min(best, time.perf_counter() - start)
            print(f"peer {peer} net={file.removesuffix('.mlmodel')} batch={batch} samples={samples} "
                  f"epochs={epochs} seconds={best:.6f} loss={loss:.6f}", flush=True)


def table(lines):
    """net | mini-batch | samples/s of each peer | Attune's ratio to each | loss spread."""
    results, notes = {}, []
    for line in lines:
        if not line.startswith("peer "):
            continue
        words = line.split()
        peer = words[1]
        if words[2] in ("blas:", "pool:", "skipped:"):
            notes.append(f"  {peer}: {' '.join(words[3:])}")
            continue
        fields = dict(w.split("=", 1) for w in words[2:])
        rate = int(fields["samples"]) * int(fields["epochs"]) / float(fields["seconds"])
        results[(fields["net"], int(fields["batch"]), peer)] = (rate, float(fields["loss"]))
    keys = sorted({(net, batch) for net, batch, _ in results}, key=lambda k: (int(k[0].split("-")[1]), k[1]))
    peers = [p for p in ("attune", "numpy", "torch") if any(k[2] == p for k in results)]
    names = {"attune": "Attune", "numpy": "NumPy", "torch": "PyTorch"}
    header = ["net", "mini-batch"] + [f"{names[p]} samples/s" for p in peers]
    header += [f"Attune/{names[p]}" for p in peers if p != "attune"] + ["loss spread"]
    out = [header]
    for net, batch in keys:
        got = {p: results.get((net, batch, p)) for p in peers}
        row = [net.removeprefix("mlp-"), str(batch)]
        row += [f"{got[p][0]:,.0f}" if got[p] else "-" for p in peers]
        attune = got.get("attune")
        row += [f"{attune[0] / got[p][0]:.2f}x" if attune and got[p] else "-" for p in peers if p != "attune"]
        losses = [v[1] for v in got.values() if v]
        row.append(f"{(max(losses) - min(losses)) / max(abs(min(losses)), 1e-12):.1e}")
        out.append(row)
    widths = [max(len(r[i]) for r in out) for i in range(len(header))]
    for r in out:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)))
    for note in notes:
        print(note)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("peer", choices=["numpy", "torch", "table"])
    parser.add_argument("fixtures", nargs="?")
    parser.add_argument("--nets", default="mlp-64-32-10.mlmodel:10 mlp-784-128-10.mlmodel:3")
    parser.add_argument("--samples", type=int, default=4000)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if args.peer == "table":
        table(sys.stdin.read().splitlines())
    else:
        run(args.peer, args.fixtures, args.nets, args.samples, args.threads)


if __name__ == "__main__":
    main()
