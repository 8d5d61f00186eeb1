"""The peers Benchmarks/training.sh races Attune's update tasks against: the same nets, rows and update rule
written the way a Python developer would, in NumPy (float32, vectorized per mini-batch, NumPy's own OpenBLAS)
and in PyTorch on the CPU; and the table of all runs.

  python training_peers.py numpy FIXTURES --nets NETS [--samples N] [--repeats R]
  python training_peers.py torch FIXTURES --nets NETS [--samples N] [--repeats R] --threads T
  python training_peers.py table < lines     # min/median/max over the runs, the peak, the targets

NETS is "file:epochs:batch,batch ...". Each net is a coremltools file (Tests/python/coreml_fixtures.py): the
dense nets in -> dense -> ReLU -> dense(10) -> softmax, the conv net conv3x3 same -> ReLU -> max 2x2 ->
flatten -> dense -> ReLU -> dense(10) -> softmax; categorical cross-entropy, SGD with momentum. Initial
weights, learning rate and momentum are read from the file, so every peer starts from the same point. The
rows are the formula attune-training-bench uses: x[i][j] = ((7919 i + 104729 j) mod 1009) / 1009, label
i mod 10, in file order (no shuffle); best of R tasks. Each peer prints one line per net and mini-batch,

  peer NAME net=... batch=... samples=... epochs=... seconds=... loss=...

where loss is the last epoch's mean, which should agree across peers (same weights, rows and rule) to
float32 rounding: a check that the peers did the same work. NumPy runs the dense nets only (a convolution
written by hand in NumPy is not what a Python developer would race).
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np


def rows(n, width):
    i = np.arange(n, dtype=np.int64)[:, None]
    j = np.arange(width, dtype=np.int64)[None, :]
    x = (((7919 * i + 104729 * j) % 1009) / 1009).astype(np.float32)
    return x, (np.arange(n) % 10).astype(np.int64)


def parse_nets(text):
    """[(file, epochs, [batch, ...])] from "file:epochs:8,32 ..."."""
    nets = []
    for item in text.split():
        file, epochs, batches = item.split(":")
        nets.append((file, int(epochs), [int(b) for b in batches.split(",")]))
    return nets


def read_net(path):
    """(input shape, layers, learning rate, momentum): layers as ("dense", W, b), ("conv", W, b, pad),
    ("relu",), ("maxpool", k), ("flatten",), float32 tensors in Core ML's layouts ([out][in] and
    [out][in][kh][kw], which are PyTorch's too)."""
    from coremltools.proto import Model_pb2
    spec = Model_pb2.Model()
    with open(path, "rb") as f:
        spec.ParseFromString(f.read())
    nn = spec.neuralNetworkClassifier
    layers = []
    for layer in nn.layers:
        kind = layer.WhichOneof("layer")
        if kind == "innerProduct":
            d = layer.innerProduct
            w = np.array(d.weights.floatValue, dtype=np.float32).reshape(d.outputChannels, d.inputChannels)
            layers.append(("dense", w, np.array(d.bias.floatValue, dtype=np.float32)))
        elif kind == "convolution":
            c = layer.convolution
            k = list(c.kernelSize)
            w = np.array(c.weights.floatValue, dtype=np.float32).reshape(c.outputChannels, c.kernelChannels, *k)
            pad = k[0] // 2 if c.WhichOneof("ConvolutionPaddingType") == "same" else 0
            layers.append(("conv", w, np.array(c.bias.floatValue, dtype=np.float32), pad))
        elif kind == "activation":
            layers.append(("relu",))
        elif kind == "pooling":
            layers.append(("maxpool", layer.pooling.kernelSize[0]))
        elif kind == "flatten":
            layers.append(("flatten",))
    shape = tuple(spec.description.input[0].type.multiArrayType.shape)
    sgd = nn.updateParams.optimizer.sgdOptimizer
    return shape, layers, sgd.learningRate.defaultValue, sgd.momentum.defaultValue


def numpy_task(net, x, t, epochs, batch):
    """One update task of a two-dense-layer net: the loop a Python developer writes. Returns the last
    epoch's mean loss."""
    _, layers, lr, momentum = net
    (_, w1, b1), _, (_, w2, b2) = layers
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


def torch_model(torch, layers):
    modules = []
    for layer in layers:
        if layer[0] == "dense":
            module = torch.nn.Linear(layer[1].shape[1], layer[1].shape[0])
        elif layer[0] == "conv":
            out_c, in_c, kh, kw = layer[1].shape
            module = torch.nn.Conv2d(in_c, out_c, (kh, kw), padding=layer[3])
        elif layer[0] == "relu":
            modules.append(torch.nn.ReLU())
            continue
        elif layer[0] == "maxpool":
            modules.append(torch.nn.MaxPool2d(layer[1]))
            continue
        else:
            modules.append(torch.nn.Flatten())
            continue
        with torch.no_grad():
            module.weight.copy_(torch.from_numpy(layer[1]))
            module.bias.copy_(torch.from_numpy(layer[2]))
        modules.append(module)
    return torch.nn.Sequential(*modules)


def torch_task(torch, net, x, t, epochs, batch):
    shape, layers, lr, momentum = net
    model = torch_model(torch, layers)
    # PyTorch's momentum (v <- m v + g; w <- w - lr v) equals Core ML's (v <- m v - lr g; w <- w + v) at a
    # constant learning rate.
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    criterion = torch.nn.CrossEntropyLoss()
    xs, ts = torch.from_numpy(x).reshape(len(x), *shape), torch.from_numpy(t)
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


def run(peer, fixtures, nets, samples, repeats, threads):
    if peer == "numpy":
        from threadpoolctl import threadpool_info
        blas = [f"{p['internal_api']} {p['version']} {p['architecture']}, {p['num_threads']} thread(s)"
                for p in threadpool_info() if p["user_api"] == "blas"]
        print(f"peer numpy blas: numpy {np.__version__}, {'; '.join(blas) or 'no BLAS found'}", flush=True)
        task = numpy_task
    else:
        import torch
        torch.set_num_threads(threads)
        print(f"peer torch blas: torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()} kernels, "
              f"{torch.get_num_threads()} thread(s)", flush=True)
        task = lambda *a: torch_task(torch, *a)  # noqa: E731
    for file, epochs, batches in parse_nets(nets):
        net = read_net(os.path.join(fixtures, file))
        if peer == "numpy" and [layer[0] for layer in net[1]] != ["dense", "relu", "dense"]:
            continue
        x, t = rows(samples, int(np.prod(net[0])))
        # One task untimed first, as attune-training-bench does: the first one pays for loading and warming up.
        task(net, x, t, 1, batches[0])
        for batch in batches:
            best, loss = float("inf"), None
            for _ in range(repeats):
                start = time.perf_counter()
                loss = task(net, x, t, epochs, batch)
                best = min(best, time.perf_counter() - start)
            print(f"peer {peer} net={file.removesuffix('.mlmodel')} batch={batch} samples={samples} "
                  f"epochs={epochs} seconds={best:.6f} loss={loss:.6f}", flush=True)


NAMES = {"attune": "Attune", "numpy": "NumPy", "torch": "PyTorch"}


def name(peer):
    """attune-fleet -> Attune fleet, attune-blis-zen3 -> Attune blis-zen3."""
    head, _, tail = peer.partition("-")
    return NAMES.get(head, head) + (f" {tail}" if tail else "")


def read_lines(lines):
    """{(net, batch, peer): [(samples/s, loss, flops per sample)], one per round}, peer notes, the peak lines.
    A round begins at its peak line; a peer's best task of the round stands for it (the peers take turns
    within a round, task by task)."""
    rounds, notes, peaks = {}, {}, []
    for line in lines:
        words = line.split()
        if line.startswith("peak "):
            peaks.append(dict(w.split("=", 1) for w in words[1:]))
            continue
        if not line.startswith("peer "):
            continue
        peer = words[1]
        if words[2] in ("blas:", "pool:", "skipped:"):
            notes[(peer, words[2])] = f"  {name(peer)} {words[2][:-1]}: {' '.join(words[3:])}"
            continue
        fields = dict(w.split("=", 1) for w in words[2:])
        rate = int(fields["samples"]) * int(fields["epochs"]) / float(fields["seconds"])
        flops = int(fields["flops_per_sample"]) if "flops_per_sample" in fields else None
        best = rounds.setdefault((fields["net"], int(fields["batch"]), peer), {})
        if len(peaks) not in best or rate > best[len(peaks)][0]:
            best[len(peaks)] = (rate, float(fields["loss"]), flops)
    results = {key: [best[r] for r in sorted(best)] for key, best in rounds.items()}
    return results, list(notes.values()), peaks


def spread(values, fmt):
    values = sorted(values)
    return f"{fmt(values[0])} / {fmt(statistics.median(values))} / {fmt(values[-1])}"


def table(lines):
    """Per net and mini-batch: each peer's median samples/s over the runs, Attune's ratio to each peer
    (min / median / max of the runs' ratios, each run's Attune against the same run's peer), the loss
    spread; then the GFLOP/s line and the targets."""
    results, notes, peaks = read_lines(lines)
    keys = sorted({(net, batch) for net, batch, _ in results},
                  key=lambda k: (k[0].startswith("conv"), int(k[0].split("-")[1]), k[1]))
    peers = [p for p in ("attune", "numpy", "torch") if any(k[2] == p for k in results)]
    runs = max((len(v) for v in results.values()), default=0)
    header = ["net", "mini-batch"] + [f"{NAMES[p]} samples/s" for p in peers]
    header += [f"Attune/{NAMES[p]} min / median / max" for p in peers if p != "attune"] + ["loss spread"]
    out = [header]
    ratios = {}
    for net, batch in keys:
        got = {p: results.get((net, batch, p), []) for p in peers}
        row = [net.removeprefix("mlp-"), str(batch)]
        row += [f"{statistics.median(r for r, _, _ in got[p]):,.0f}" if got[p] else "-" for p in peers]
        for p in peers:
            if p == "attune":
                continue
            pairs = [a[0] / b[0] for a, b in zip(got["attune"], got[p])]
            ratios[(net, batch, p)] = pairs
            row.append(spread(pairs, lambda v: f"{v:.2f}x") if pairs else "-")
        losses = [v[1] for values in got.values() for v in values]
        row.append(f"{(max(losses) - min(losses)) / max(abs(min(losses)), 1e-12):.1e}")
        out.append(row)
    widths = [max(len(r[i]) for r in out) for i in range(len(header))]
    print(f"samples/s: the median of {runs} run(s), each the best of its tasks; ratios: each run's Attune "
          "against the same run's peer")
    for r in out:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)))
    variants = sorted({p for _, _, p in results if p.startswith("attune-")})
    variant_ratios = {}
    if variants:
        print()
        print("Other Attune runs (the same rows, taking turns with the peers above in each round): samples/s, and the "
              "ratio to the same round's NumPy (PyTorch for the conv net) and in-process Attune, min / median / max")
        out = [["run", "net", "mini-batch", "samples/s", "/ peer", "/ Attune in process"]]
        for variant in variants:
            for net, batch in keys:
                got = results.get((net, batch, variant))
                if not got:
                    continue
                peer = "torch" if net.startswith("conv") else "numpy"
                against = [a[0] / b[0] for a, b in zip(got, results.get((net, batch, peer), []))]
                variant_ratios[(net, batch, peer, variant)] = against
                own = [a[0] / b[0] for a, b in zip(got, results.get((net, batch, "attune"), []))]
                out.append([name(variant), net.removeprefix("mlp-"), str(batch),
                            f"{statistics.median(r for r, _, _ in got):,.0f}",
                            (spread(against, lambda v: f"{v:.2f}x") + f" {NAMES[peer]}") if against else "-",
                            spread(own, lambda v: f"{v:.2f}x") if own else "-"])
        widths = [max(len(r[i]) for r in out) for i in range(len(out[0]))]
        for r in out:
            print("  ".join(c.rjust(w) for c, w in zip(r, widths)))
    for note in notes:
        print(note)
    # The targets (docs/benchmarks.md#training-speed): in process and through the fleet.
    targets = []
    need = {"mlp-784-128-10": {8: 1.5, 32: 1.5, 256: 1.5}, "mlp-64-32-10": {8: 1.5, 32: 1.5, 256: 1.0}}
    runs_judged = [((n, b, p), "in process", r) for (n, b, p), r in ratios.items()]
    runs_judged += [((n, b, p), "through the fleet", r) for (n, b, p, v), r in variant_ratios.items() if v == "attune-fleet"]
    for (net, batch, peer), where, pairs in sorted(runs_judged):
        if peer != "numpy" or batch not in need.get(net, {}) or not pairs:
            continue
        goal = need[net][batch]
        targets.append((f"{net.removeprefix('mlp-')} at mini-batch {batch} >= {goal}x NumPy in every run, {where}",
                        min(pairs) >= goal, f"min {min(pairs):.2f}x, median {statistics.median(pairs):.2f}x"))
    big = "mlp-784-128-10"
    if peaks:
        gflops = [r * f / 1e9 for r, _, f in results.get((big, 256, "attune"), []) if f]
        # The CPU's peak: its highest clock measured with every core busy (the host may take time from these
        # cores in a round; the round's own probe, printed beside, shows when it did).
        top = max(peaks, key=lambda p: float(p["gflops"]))
        limit = float(top["gflops"])
        clocks = [float(p["clock_ghz"]) for p in peaks]
        print()
        print(f"FMA peak: {top['cores']} cores x {top['fma_units']} FMA units x {int(top['vector_bits']) // 32} "
              f"float32 lanes ({top['vector_bits']}-bit) x 2 flops x {top['clock_ghz']} GHz = {limit:.1f} GFLOP/s "
              f"({top['cpu'].replace('_', ' ')}; the clock measured with every core busy, the highest of the "
              f"rounds' probes: {', '.join(f'{c:.2f}' for c in clocks)} GHz; one core alone: {top['one_core_ghz']} "
              f"GHz; an FMA loop on every core measured {float(top['fma_loop_gflops']):.1f} GFLOP/s)")
        if gflops:
            own = [g / float(p["gflops"]) for g, p in zip(gflops, peaks)]
            print(f"784-128-10 at mini-batch 256: {spread(gflops, lambda v: f'{v:.1f}')} GFLOP/s (min / median / "
                  f"max) = {spread(gflops, lambda v: f'{100 * v / limit:.0f}%')} of the FMA peak "
                  f"(of each round's own probe: {spread(own, lambda v: f'{100 * v:.0f}%')})")
            targets.append(("784-128-10 at mini-batch 256 >= 70% of the FMA peak in every run",
                            min(gflops) >= 0.7 * limit, f"min {100 * min(gflops) / limit:.0f}%, "
                            f"median {100 * statistics.median(gflops) / limit:.0f}%"))
    for batch in sorted({b for n, b, p in ratios if n.startswith("conv") and p == "torch"}):
        net = next(n for n, b, p in ratios if n.startswith("conv"))
        pairs = ratios[(net, batch, "torch")]
        targets.append((f"{net} at mini-batch {batch} >= PyTorch in every run", min(pairs) >= 1.0,
                        f"min {min(pairs):.2f}x, median {statistics.median(pairs):.2f}x"))
    if targets:
        print()
        for what, met, figure in targets:
            print(f"  {'PASS' if met else 'MISS'}  {what}: {figure}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("peer", choices=["numpy", "torch", "table"])
    parser.add_argument("fixtures", nargs="?")
    parser.add_argument("--nets", default="mlp-64-32-10.mlmodel:10:8,32,256 mlp-784-128-10.mlmodel:3:8,32,256")
    parser.add_argument("--samples", type=int, default=4000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if args.peer == "table":
        table(sys.stdin.read().splitlines())
    else:
        run(args.peer, args.fixtures, args.nets, args.samples, args.repeats, args.threads)


if __name__ == "__main__":
    main()
