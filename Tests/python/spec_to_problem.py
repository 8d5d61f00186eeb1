#!/usr/bin/env python3
"""Turns a coremltools-readable updatable neural network (.mlmodel) plus samples into a reference problem
(the JSON format of reference_sgd.py, see the shared reference-schema), read with coremltools' own
load_spec so the result does not depend on Attune's Swift parser.

Usage:
  spec_to_problem.py MODEL.mlmodel SAMPLES.json OUT.json [--state STATE.json] [--epochs N] [--lr F]
                     [--batch N] [--momentum F] [--beta1 F] [--beta2 F] [--eps F] [--shuffle true|false]
                     [--seed N]
  spec_to_problem.py --self-test FIXTURES_DIR      (the models coreml_fixtures.py writes)

SAMPLES.json: {"inputs": [[float]], "targets": [...]}
  inputs: one flat row-major CHW list per sample. For an image input, raw pixel values (0-255) in the
    network's channel order (gray; R,G,B for RGB; B,G,R for BGR); the model's preprocessing scaler
    (x * channelScale + bias of that channel) is applied here, so the problem holds what the first layer sees.
  targets: cross-entropy - class labels of the classifier ("3" or 3 both name label "3"; for int64 labels
    the integer), or class indices for a plain neuralNetwork; MSE - [[float]] of the output's width.
STATE.json: {"<layer>.weights": [...], "<layer>.bias": [...]} written over the updatable layers' tensors
  (e.g. a personal version's weights), in the spec's own layouts (dense [out][in], conv [out][in][kh][kw]).
Overrides replace the model's update-parameter defaults (updateParams: epochs, shuffle, seed; the
optimizer's learningRate, miniBatchSize, momentum or beta1/beta2/eps).

The layer chain runs from the model input to the loss layer's input; every layer must read the previous
layer's output. Supported: innerProduct, convolution (groups 1, dilation 1, valid without explicit padding
or same BOTTOM_RIGHT_HEAVY), pooling (max/average, valid/same, not global), batchnorm (stored statistics),
reshape, flatten (channel-first), activation (ReLU, leaky ReLU, sigmoid, tanh, linear), softmax.
Anything else stops with a message naming the layer. trainable = the layer's isUpdatable flag.
"""
import argparse
import contextlib
import io
import json
import math
import os
import sys

import numpy as np
import coremltools.models.utils as utils
from coremltools.proto import Model_pb2

NEURAL_KINDS = ("neuralNetworkClassifier", "neuralNetwork", "neuralNetworkRegressor")


class ProblemError(Exception):
    pass


def weight_values(params, what):
    """A WeightParams as float64: floatValue, or little-endian float32/float16 bytes."""
    if len(params.floatValue):
        return np.array(params.floatValue, dtype=np.float64)
    if len(params.rawValue):
        return np.frombuffer(params.rawValue, dtype="<f4").astype(np.float64)
    if len(params.float16Value):
        return np.frombuffer(params.float16Value, dtype="<f2").astype(np.float64)
    raise ProblemError(f"{what} has no weights (floatValue, rawValue and float16Value are all empty)")


def two(values, default, what):
    values = list(values) or default
    if len(values) != 2:
        raise ProblemError(f"{what} must have 2 values, found {values}")
    return [int(v) for v in values]


def spatial_out(size, kernel, stride, padding):
    """Core ML's output size for one spatial axis."""
    if padding == "valid":
        return (size - kernel) // stride + 1
    return math.ceil(size / stride)


def network_of(spec):
    kind = spec.WhichOneof("Type")
    if kind not in NEURAL_KINDS:
        raise ProblemError(f"the model is a {kind}; spec_to_problem handles neural networks only "
                           "(use reference_knn.py for k-NN models)")
    return kind, getattr(spec, kind)


def input_shape_and_scaler(spec, network):
    feature = spec.description.input[0]
    kind = feature.type.WhichOneof("Type")
    if kind == "multiArrayType":
        shape = [int(d) for d in feature.type.multiArrayType.shape]
        return feature.name, shape, None
    if kind == "imageType":
        image = feature.type.imageType
        space = Model_pb2.ImageFeatureType.ColorSpace.Name(image.colorSpace)
        channels = 1 if space.startswith("GRAYSCALE") else 3
        shape = [channels, int(image.height), int(image.width)]
        scale, bias = 1.0, [0.0] * channels
        for pre in network.preprocessing:
            if pre.featureName in ("", feature.name):
                if pre.HasField("meanImage"):
                    raise ProblemError("mean-image preprocessing is not supported; use a scaler")
                if pre.HasField("scaler"):
                    s = pre.scaler
                    scale = s.channelScale
                    bias = {"GRAYSCALE": [s.grayBias], "GRAYSCALE_FLOAT16": [s.grayBias],
                            "RGB": [s.redBias, s.greenBias, s.blueBias],
                            "BGR": [s.blueBias, s.greenBias, s.redBias]}[space]
        return feature.name, shape, (scale, bias)
    raise ProblemError(f"input {feature.name} is a {kind}; expected a multiArray or an image")


def layer_entry(layer, shape):
    """The problem-format layer for one Core ML layer and the CHW (or [C]) shape it produces."""
    kind = layer.WhichOneof("layer")
    name = layer.name
    trainable = bool(layer.isUpdatable)
    if kind == "innerProduct":
        p = layer.innerProduct
        n_in, n_out = int(p.inputChannels), int(p.outputChannels)
        if int(np.prod(shape)) != n_in or (len(shape) == 3 and shape[1:] != [1, 1]):
            raise ProblemError(f"layer {name}: innerProduct expects {n_in} channels, gets shape {shape}")
        weights = weight_values(p.weights, f"layer {name} weights")
        if weights.size != n_in * n_out:
            raise ProblemError(f"layer {name}: {weights.size} weights for {n_out}x{n_in}")
        bias = weight_values(p.bias, f"layer {name} bias").tolist() if p.hasBias else None
        return ({"type": "dense", "name": name, "in": n_in, "out": n_out, "weights": weights.tolist(),
                 "bias": bias, "trainable": trainable}, [n_out])
    if kind == "convolution":
        p = layer.convolution
        if p.isDeconvolution or p.nGroups > 1 or any(d != 1 for d in p.dilationFactor):
            raise ProblemError(f"layer {name}: only plain convolutions (groups 1, dilation 1) are supported")
        kernel = two(p.kernelSize, [3, 3], f"layer {name} kernelSize")
        stride = two(p.stride, [1, 1], f"layer {name} stride")
        padding = conv_padding(p, name)
        c, h, w = chw(shape, name)
        if c != p.kernelChannels:
            raise ProblemError(f"layer {name}: kernelChannels {p.kernelChannels}, input has {c} channels")
        out_c = int(p.outputChannels)
        weights = weight_values(p.weights, f"layer {name} weights")
        if weights.size != out_c * c * kernel[0] * kernel[1]:
            raise ProblemError(f"layer {name}: {weights.size} weights for [{out_c}][{c}][{kernel}]")
        bias = weight_values(p.bias, f"layer {name} bias").tolist() if p.hasBias else None
        out_shape = [out_c, spatial_out(h, kernel[0], stride[0], padding),
                     spatial_out(w, kernel[1], stride[1], padding)]
        return ({"type": "conv", "name": name, "in_channels": c, "out_channels": out_c, "kernel": kernel,
                 "stride": stride, "padding": padding, "weights": weights.tolist(), "bias": bias,
                 "trainable": trainable}, out_shape)
    if kind == "pooling":
        p = layer.pooling
        mode = {0: "max", 1: "avg"}.get(p.type)
        if mode is None or p.globalPooling:
            raise ProblemError(f"layer {name}: only max and average pooling over a window are supported")
        kernel = two(p.kernelSize, [3, 3], f"layer {name} kernelSize")
        stride = two(p.stride, [1, 1], f"layer {name} stride")
        padding = conv_padding(p, name)
        c, h, w = chw(shape, name)
        return ({"type": "pool", "name": name, "mode": mode, "kernel": kernel, "stride": stride,
                 "padding": padding, "exclude_padding": bool(p.avgPoolExcludePadding)},
                [c, spatial_out(h, kernel[0], stride[0], padding), spatial_out(w, kernel[1], stride[1], padding)])
    if kind == "batchnorm":
        p = layer.batchnorm
        if p.computeMeanVar or p.instanceNormalization:
            raise ProblemError(f"layer {name}: only batchnorm with stored mean and variance is supported")
        channels = int(p.channels)
        if shape[0] != channels:
            raise ProblemError(f"layer {name}: {channels} channels, input shape {shape}")
        entry = {"type": "batchnorm", "name": name, "channels": channels, "epsilon": float(p.epsilon)}
        for field in ("gamma", "beta", "mean", "variance"):
            entry[field] = weight_values(getattr(p, field), f"layer {name} {field}").tolist()
        return entry, list(shape)
    if kind == "reshape":
        target = [int(d) for d in layer.reshape.targetShape]
        if len(target) == 4:
            target = target[1:]
        if layer.reshape.mode != 0 or int(np.prod(target)) != int(np.prod(shape)):
            raise ProblemError(f"layer {name}: channel-first reshape of {shape} to {target} is not possible")
        return {"type": "reshape", "name": name, "shape": target}, target
    if kind == "flatten":
        if layer.flatten.mode != 0:
            raise ProblemError(f"layer {name}: only channel-first flatten is supported")
        return {"type": "flatten", "name": name}, [int(np.prod(shape))]
    if kind == "activation":
        act = layer.activation
        which = act.WhichOneof("NonlinearityType")
        simple = {"ReLU": "relu", "sigmoid": "sigmoid", "tanh": "tanh"}
        if which in simple:
            return {"type": simple[which], "name": name}, list(shape)
        if which == "leakyReLU":
            return {"type": "leaky_relu", "name": name, "alpha": float(act.leakyReLU.alpha)}, list(shape)
        if which == "linear":
            return ({"type": "linear", "name": name, "alpha": float(act.linear.alpha),
                     "beta": float(act.linear.beta)}, list(shape))
        raise ProblemError(f"layer {name}: activation {which} is not supported")
    if kind == "softmax":
        return {"type": "softmax", "name": name}, list(shape)
    raise ProblemError(f"layer {name}: {kind} layers are not supported by the reference")


def conv_padding(params, name):
    which = params.WhichOneof("ConvolutionPaddingType" if hasattr(params, "isDeconvolution")
                              else "PoolingPaddingType")
    if which == "valid":
        if any(b.startEdgeSize or b.endEdgeSize for b in params.valid.paddingAmounts.borderAmounts):
            raise ProblemError(f"layer {name}: explicit padding amounts are not supported")
        return "valid"
    if which == "same":
        if params.same.asymmetryMode != 0:
            raise ProblemError(f"layer {name}: only BOTTOM_RIGHT_HEAVY same padding is supported")
        return "same"
    raise ProblemError(f"layer {name}: padding {which} is not supported")


def chw(shape, name):
    if len(shape) != 3:
        raise ProblemError(f"layer {name} needs a [C, H, W] input, gets {shape}")
    return shape


def layer_chain(network, input_name, input_shape, loss_input):
    layers, blob, shape = [], input_name, list(input_shape)
    for layer in network.layers:
        if blob == loss_input:
            break
        if list(layer.input) != [blob] or len(layer.output) != 1:
            raise ProblemError(f"layer {layer.name} reads {list(layer.input)}, not the chain's {blob}; "
                               "only single-path networks are supported")
        entry, shape = layer_entry(layer, shape)
        layers.append(entry)
        blob = layer.output[0]
    if blob != loss_input:
        raise ProblemError(f"the chain ends at {blob}, never reaching the loss input {loss_input}")
    return layers, shape


def loss_of(update):
    if len(update.lossLayers) != 1:
        raise ProblemError(f"expected one loss layer, found {len(update.lossLayers)}")
    loss = update.lossLayers[0]
    which = loss.WhichOneof("LossLayerType")
    if which == "categoricalCrossEntropyLossLayer":
        return "cross_entropy", loss.categoricalCrossEntropyLossLayer.input
    if which == "meanSquaredErrorLossLayer":
        return "mse", loss.meanSquaredErrorLossLayer.input
    raise ProblemError(f"loss {which} is not supported")


def optimizer_settings(update):
    which = update.optimizer.WhichOneof("OptimizerType")
    if which == "sgdOptimizer":
        o = update.optimizer.sgdOptimizer
        return {"optimizer": "sgd", "learning_rate": o.learningRate.defaultValue,
                "mini_batch_size": int(o.miniBatchSize.defaultValue), "momentum": o.momentum.defaultValue}
    if which == "adamOptimizer":
        o = update.optimizer.adamOptimizer
        return {"optimizer": "adam", "learning_rate": o.learningRate.defaultValue,
                "mini_batch_size": int(o.miniBatchSize.defaultValue), "beta1": o.beta1.defaultValue,
                "beta2": o.beta2.defaultValue, "eps": o.eps.defaultValue}
    raise ProblemError(f"optimizer {which} is not supported")


def class_index(spec, kind, target):
    if kind != "neuralNetworkClassifier":
        return int(target)
    classifier = spec.neuralNetworkClassifier
    if classifier.WhichOneof("ClassLabels") == "int64ClassLabels":
        labels = list(classifier.int64ClassLabels.vector)
        key = int(target)
    else:
        labels = list(classifier.stringClassLabels.vector)
        key = str(target)
    if key not in labels:
        raise ProblemError(f"target {target!r} is not one of the model's class labels {labels}")
    return labels.index(key)


def build_problem(spec, samples, state=None, overrides=None):
    kind, network = network_of(spec)
    input_name, input_shape, scaler = input_shape_and_scaler(spec, network)
    update = network.updateParams
    loss, loss_input = loss_of(update)
    layers, out_shape = layer_chain(network, input_name, input_shape, loss_input)
    if loss == "cross_entropy" and layers[-1]["type"] != "softmax":
        raise ProblemError("cross-entropy needs the loss input to be a softmax output")

    width = int(np.prod(input_shape))
    inputs = np.array(samples["inputs"], dtype=np.float64)
    if inputs.ndim != 2 or inputs.shape[1] != width:
        raise ProblemError(f"each input must hold {width} numbers ({input_shape}), got {inputs.shape}")
    if scaler is not None:
        scale, bias = scaler
        plane = width // len(bias)
        inputs = inputs * scale + np.repeat(np.array(bias), plane)[None, :]
    if loss == "cross_entropy":
        targets = [class_index(spec, kind, t) for t in samples["targets"]]
    else:
        targets = np.array(samples["targets"], dtype=np.float64).reshape(len(samples["targets"]), -1)
        if targets.shape[1] != int(np.prod(out_shape)):
            raise ProblemError(f"MSE targets need {int(np.prod(out_shape))} values each, got {targets.shape[1]}")
        targets = targets.tolist()
    if len(targets) != len(inputs):
        raise ProblemError(f"{len(inputs)} inputs but {len(targets)} targets")

    problem = {"input_shape": input_shape, "inputs": inputs.tolist(), "targets": targets, "layers": layers,
               "loss": loss, "epochs": int(update.epochs.defaultValue),
               "shuffle": bool(update.shuffle.defaultValue), "seed": int(update.seed.defaultValue)}
    problem.update(optimizer_settings(update))
    apply_state(layers, state or {})
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        if key in ("momentum",) and problem["optimizer"] != "sgd" or \
                key in ("beta1", "beta2", "eps") and problem["optimizer"] != "adam":
            raise ProblemError(f"--{key} does not apply to the model's {problem['optimizer']} optimizer")
        problem[key] = value
    return problem


def apply_state(layers, state):
    tensors = {}
    for layer in layers:
        if layer.get("trainable"):
            tensors[layer["name"] + ".weights"] = (layer, "weights")
            if layer.get("bias") is not None:
                tensors[layer["name"] + ".bias"] = (layer, "bias")
    for name, values in state.items():
        if name not in tensors:
            raise ProblemError(f"state tensor {name} is not an updatable tensor of the model "
                               f"(updatable: {sorted(tensors)})")
        layer, field = tensors[name]
        if len(values) != len(layer[field]):
            raise ProblemError(f"state tensor {name} has {len(values)} values, the model {len(layer[field])}")
        layer[field] = [float(v) for v in values]


def parse_bool(text):
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError("use true or false")


# ---------------------------------------------------------------------------------------------------
# Self-test on the fixtures coreml_fixtures.py writes

def self_test(fixtures):
    """Checks every neural-network fixture converts, shapes chain up, overrides/state apply, raw weights read
    like float lists, and the dense-only problem trains in reference_sgd.py. Returns the failures."""
    import subprocess
    import tempfile
    manifest = json.load(open(os.path.join(fixtures, "fixtures.json")))
    rng = np.random.default_rng(5)
    failures = []
    for name, entry in sorted(manifest.items()):
        if not name.endswith(".mlmodel") or not entry["kind"].startswith("neuralNetwork"):
            continue
        spec = utils.load_spec(os.path.join(fixtures, name))
        width = int(np.prod(entry["input"]["shape"]))
        inputs = rng.uniform(0, 16, (6, width)).tolist()
        mse = "value_true" == entry["label"]
        targets = rng.normal(0, 1, (6, 2)).tolist() if mse else [str(d) for d in rng.integers(0, 10, 6)]
        samples = {"inputs": inputs, "targets": targets}
        try:
            problem = build_problem(spec, samples, overrides={"epochs": 2, "seed": 3})
            trainable = [layer["name"] for layer in problem["layers"] if layer.get("trainable")]
            assert trainable == entry["updatable"], (trainable, entry["updatable"])
            assert problem["epochs"] == 2 and problem["seed"] == 3
            assert problem["loss"] == ("mse" if mse else "cross_entropy")
            first = next(layer for layer in problem["layers"] if layer.get("trainable"))
            state = {first["name"] + ".weights": [0.5] * len(first["weights"])}
            assert build_problem(spec, samples, state=state)["layers"][problem["layers"].index(first)]["weights"] \
                == state[first["name"] + ".weights"]
            # The same weights stored as raw little-endian float32 must read the same.
            raw = Model_pb2.Model()
            raw.CopyFrom(spec)
            for layer in getattr(raw, raw.WhichOneof("Type")).layers:
                if layer.WhichOneof("layer") in ("innerProduct", "convolution"):
                    params = getattr(layer, layer.WhichOneof("layer")).weights
                    values = np.array(params.floatValue, dtype="<f4")
                    params.ClearField("floatValue")
                    params.rawValue = values.tobytes()
            assert build_problem(raw, samples, overrides={"epochs": 2, "seed": 3}) == problem
            if "image" in entry["input"]["type"]:
                first_value = problem["inputs"][0][0]
                assert abs(first_value - (inputs[0][0] / 127.5 - 1)) < 1e-6, first_value
            if all(layer["type"] in ("dense", "relu", "softmax") for layer in problem["layers"]) \
                    and problem["optimizer"] == "sgd":
                with tempfile.TemporaryDirectory() as tmp:
                    json.dump(dict(problem, targets=problem["targets"]), open(f"{tmp}/p.json", "w"))
                    here = os.path.dirname(os.path.abspath(__file__))
                    subprocess.run([sys.executable, os.path.join(here, "reference_sgd.py"), f"{tmp}/p.json",
                                    f"{tmp}/o.json"], check=True)
                    losses = json.load(open(f"{tmp}/o.json"))["epoch_losses"]
                    assert len(losses) == 2 and all(np.isfinite(losses)), losses
            print(f"ok {name}: {len(problem['layers'])} layers, trainable {trainable}, {problem['optimizer']}")
        except (AssertionError, ProblemError) as error:
            failures.append(f"{name}: {error!r}")
    failures += conv_layout_check()
    failures += pretrained_update_check(fixtures, manifest)
    try:
        build_problem(utils.load_spec(os.path.join(fixtures, "digits-knn.mlmodel")), {"inputs": [], "targets": []})
        failures.append("a k-NN model was accepted")
    except ProblemError:
        pass
    return failures


def pretrained_update_check(fixtures, manifest):
    """User 0's update of digits-pretrained, through this script and reference_sgd.py, must reproduce the
    held-out accuracy the fixture script's own NumPy trainer recorded (two independent code paths)."""
    import gzip
    import subprocess
    import tempfile
    user = manifest["digits_blocks"]["users"][0]
    here = os.path.dirname(os.path.abspath(__file__))
    rows = np.loadtxt(gzip.open(os.path.join(here, "..", "..", "examples", "data", "digits.csv.gz"), "rt"),
                      delimiter=",")
    (ta, tb), (ha, hb) = user["train_rows"], user["held_out_rows"]
    samples = {"inputs": rows[ta:tb, :64].tolist(), "targets": [str(int(v)) for v in rows[ta:tb, 64]]}
    problem = build_problem(utils.load_spec(os.path.join(fixtures, "digits-pretrained.mlmodel")), samples)
    with tempfile.TemporaryDirectory() as tmp:
        json.dump(problem, open(f"{tmp}/p.json", "w"))
        subprocess.run([sys.executable, os.path.join(here, "reference_sgd.py"), f"{tmp}/p.json", f"{tmp}/o.json"],
                       check=True)
        tensors = json.load(open(f"{tmp}/o.json"))["tensors"]
    w1 = np.array(tensors["hidden.weights"]).reshape(-1, 64)
    w2 = np.array(tensors["classes.weights"]).reshape(10, -1)
    hidden = np.maximum(rows[ha:hb, :64] @ w1.T + tensors["hidden.bias"], 0)
    accuracy = float(np.mean((hidden @ w2.T + tensors["classes.bias"]).argmax(axis=1) == rows[ha:hb, 64]))
    if abs(accuracy - user["reference_accuracy_after_update"]) > 1e-9:
        return [f"user 0 after update: reference_sgd {accuracy}, manifest {user['reference_accuracy_after_update']}"]
    print(f"ok digits-pretrained user 0: {user['base_accuracy']} -> {accuracy} via spec_to_problem + reference_sgd")
    return []


def conv_layout_check():
    """A kernel given to coremltools' builder as (kh, kw, in, out) must reach the problem as [out][in][kh][kw],
    and same/stride-2 and valid sizes must follow Core ML's rules (5x7 -> 3x4 -> 1x2)."""
    from coremltools.models import datatypes
    from coremltools.models.neural_network import NeuralNetworkBuilder, SgdParams
    kernel = np.arange(3 * 3 * 2 * 4, dtype=np.float32).reshape(3, 3, 2, 4)
    builder = NeuralNetworkBuilder([("x", datatypes.Array(2, 5, 7))], [("y", datatypes.Array(3))])
    builder.add_convolution("c", kernel_channels=2, output_channels=4, height=3, width=3, stride_height=2,
                            stride_width=2, border_mode="same", groups=1, W=kernel, b=None, has_bias=False,
                            input_name="x", output_name="c_out")
    builder.add_pooling("p", height=3, width=3, stride_height=1, stride_width=1, layer_type="MAX",
                        padding_type="VALID", input_name="c_out", output_name="p_out")
    builder.add_flatten("f", 0, "p_out", "flat")
    builder.add_inner_product("d", np.zeros((3, 8), np.float32), None, 8, 3, has_bias=False,
                              input_name="flat", output_name="y")
    builder.make_updatable(["c", "d"])
    with contextlib.redirect_stdout(io.StringIO()):  # the builder announces the target it adds
        builder.set_mean_squared_error_loss("loss", input_feature=("y", datatypes.Array(3)))
    builder.set_sgd_optimizer(SgdParams(lr=0.1, batch=1))
    builder.set_epochs(1)
    try:
        problem = build_problem(builder.spec, {"inputs": [[0.0] * 70], "targets": [[0.0] * 3]})
    except ProblemError as error:
        return [f"conv layout model: {error}"]
    got = problem["layers"][0]["weights"]
    want = kernel.transpose(3, 2, 0, 1).reshape(-1).tolist()
    return [] if got == want else ["conv weights are not [out][in][kh][kw]"]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--self-test", metavar="FIXTURES_DIR")
    parser.add_argument("model", nargs="?")
    parser.add_argument("samples", nargs="?")
    parser.add_argument("out", nargs="?")
    parser.add_argument("--state")
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--lr", type=float, dest="learning_rate")
    parser.add_argument("--batch", type=int, dest="mini_batch_size")
    parser.add_argument("--momentum", type=float)
    parser.add_argument("--beta1", type=float)
    parser.add_argument("--beta2", type=float)
    parser.add_argument("--eps", type=float)
    parser.add_argument("--shuffle", type=parse_bool)
    parser.add_argument("--seed", type=int)
    args = parser.parse_args()
    if args.self_test:
        failures = self_test(args.self_test)
        for failure in failures:
            print("FAIL", failure)
        sys.exit(1 if failures else 0)
    if not (args.model and args.samples and args.out):
        parser.error("MODEL, SAMPLES and OUT are required")
    overrides = {k: getattr(args, k) for k in ("epochs", "learning_rate", "mini_batch_size", "momentum",
                                                "beta1", "beta2", "eps", "shuffle", "seed")}
    try:
        state = json.load(open(args.state)) if args.state else None
        problem = build_problem(utils.load_spec(args.model), json.load(open(args.samples)), state, overrides)
    except ProblemError as error:
        sys.exit(f"spec_to_problem: {error}")
    with open(args.out, "w") as f:
        json.dump(problem, f)


if __name__ == "__main__":
    main()
