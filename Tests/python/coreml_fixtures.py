"""Builds the updatable Core ML models the tests import, with coremltools, so CI checks Attune against
files the reference tool writes today rather than only against stored copies.

Usage: python coreml_fixtures.py OUTDIR   (needs coremltools==9.0 and numpy; runs in a few seconds)

Writes into OUTDIR the models below and `fixtures.json`, a manifest: fixture name -> kind, input feature
(name, shape, type), label/target feature, updatable layers, notes; plus "digits_blocks", the row blocks of
examples/data/digits.csv.gz used by the pretrained base and its users.
Every model is read back with coremltools' load_spec; nothing is run through a Core ML runtime.
"""
import contextlib
import gzip
import io
import json
import os
import sys

import numpy as np
import coremltools.models.utils as utils
from coremltools.models import MLModel, datatypes
from coremltools.models.neural_network import AdamParams, NeuralNetworkBuilder, SgdParams
from coremltools.models.nearest_neighbors import KNearestNeighborsClassifierBuilder
from coremltools.proto import Model_pb2

HERE = os.path.dirname(os.path.abspath(__file__))
DIGITS_CSV = os.path.join(HERE, "..", "..", "examples", "data", "digits.csv.gz")
DIGIT_LABELS = [str(i) for i in range(10)]

# Rows of digits.csv.gz: the first block plays "other writers" for the pretrained base; the rest is cut
# into users of 100 rows (the last one shorter), each trained on its first 60 rows and tested on the rest.
BASE_ROWS = (0, 1200)
USER_FIRST_ROW, USER_ROWS, USER_TRAIN_ROWS = 1200, 100, 60

MANIFEST = {}


def record(name, kind, input_name, input_shape, input_type, label, updatable, notes):
    MANIFEST[name] = {"kind": kind, "input": {"name": input_name, "shape": input_shape, "type": input_type},
                      "label": label, "updatable": updatable, "notes": notes}


def save(spec, out, name):
    path = os.path.join(out, name)
    utils.save_spec(spec, path)
    # Fails loudly if coremltools cannot read back what it wrote or rejects the spec (no runtime needed).
    MLModel(utils.load_spec(path), skip_model_load=True)
    return path


def widen_batch_sizes(optimizer, sizes=(4, 8, 16, 32)):
    """The builder allows only the default mini-batch size; widen it so tests can exercise job overrides."""
    allowed = optimizer.miniBatchSize.set.values
    allowed.extend(s for s in sizes if s not in allowed)


def load_digits():
    rows = np.loadtxt(gzip.open(DIGITS_CSV, "rt"), delimiter=",")
    return rows[:, :64], rows[:, 64].astype(np.int64)


def user_blocks(n_rows):
    """[(user index, train rows [a, b), held-out rows [b, c))] for the rows after the base block."""
    blocks, start, k = [], USER_FIRST_ROW, 0
    while start + USER_TRAIN_ROWS < n_rows:
        end = min(start + USER_ROWS, n_rows)
        blocks.append((k, (start, start + USER_TRAIN_ROWS), (start + USER_TRAIN_ROWS, end)))
        start, k = end, k + 1
    return blocks


# ---------------------------------------------------------------------------------------------------
# Dense digits classifiers (a is the existing pair; d, h reuse the shape)

def mlp_builder(weights, input_name="pixels", labels=DIGIT_LABELS):
    """in -> dense -> ReLU -> dense(10) -> softmax with the given (W1, b1, W2, b2), both dense updatable;
    the input width is W1's (64 for the digits)."""
    w1, b1, w2, b2 = (np.asarray(a, dtype=np.float32) for a in weights)
    hidden, inputs = w1.shape
    builder = NeuralNetworkBuilder([(input_name, datatypes.Array(inputs))], [("probs", datatypes.Array(10))],
                                   mode="classifier")
    builder.add_inner_product("hidden", w1, b1, inputs, hidden, has_bias=True,
                              input_name=input_name, output_name="hidden_out")
    builder.add_activation("hidden_relu", "RELU", "hidden_out", "hidden_act")
    builder.add_inner_product("classes", w2, b2, hidden, 10, has_bias=True,
                              input_name="hidden_act", output_name="scores")
    builder.add_softmax("softmax", "scores", "probs")
    builder.set_class_labels(labels, predicted_feature_name="digit", prediction_blob="probs")
    builder.make_updatable(["hidden", "classes"])
    builder.set_categorical_cross_entropy_loss(name="loss", input="probs")
    return builder


def random_mlp_weights(hidden, seed):
    rng = np.random.default_rng(seed)
    return (rng.normal(0, 0.1, (hidden, 64)), np.zeros(hidden), rng.normal(0, 0.1, (10, hidden)), np.zeros(10))


def digits_mlp(path, hidden=32, seed=11, int64_labels=False):
    """64 -> dense(hidden) -> ReLU -> dense(10) -> softmax; both dense layers updatable, cross-entropy, SGD."""
    labels = list(range(10)) if int64_labels else DIGIT_LABELS
    builder = mlp_builder(random_mlp_weights(hidden, seed), labels=labels)
    builder.set_sgd_optimizer(SgdParams(lr=0.05, batch=16))
    builder.set_epochs(5, allowed_set=[1, 2, 3, 5, 10])
    builder.set_shuffle(seed=7)
    widen_batch_sizes(builder.spec.neuralNetworkClassifier.updateParams.optimizer.sgdOptimizer, (4, 8, 32))
    utils.save_spec(builder.spec, path)


def bench_mlp(out, inputs, hidden):
    """inputs -> dense(hidden) -> ReLU -> dense(10) -> softmax, random weights; SGD lr 0.01 momentum 0.9,
    mini-batch 8, 32 or 256, no shuffle: the nets Benchmarks/training.sh races against NumPy and PyTorch."""
    rng = np.random.default_rng(inputs + hidden)
    weights = (rng.normal(0, (2 / inputs) ** 0.5, (hidden, inputs)), np.zeros(hidden),
               rng.normal(0, (2 / hidden) ** 0.5, (10, hidden)), np.zeros(10))
    builder = mlp_builder(weights)
    builder.set_sgd_optimizer(SgdParams(lr=0.01, batch=32, momentum=0.9))
    builder.set_epochs(3, allowed_set=[1, 2, 3, 5, 10, 20])
    widen_batch_sizes(builder.spec.neuralNetworkClassifier.updateParams.optimizer.sgdOptimizer, (8, 256))
    name = f"mlp-{inputs}-{hidden}-10.mlmodel"
    save(builder.spec, out, name)
    record(name, "neuralNetworkClassifier", "pixels", [inputs], "double", "digit", ["hidden", "classes"],
           f"benchmark MLP {inputs}-{hidden}-10, random weights, CE, SGD lr 0.01 momentum 0.9 batch 8/32/256, "
           "no shuffle")


def bench_conv(out):
    """[1,28,28] -> conv3x3 same(16) -> ReLU -> max2x2/2 -> flatten(3136) -> dense(32) -> ReLU -> dense(10) ->
    softmax, the convolution and both dense layers updatable; SGD lr 0.01 momentum 0.9, mini-batch 8 or 64, no
    shuffle: the small image classifier Benchmarks/training.sh races against PyTorch."""
    rng = np.random.default_rng(2828)
    builder = NeuralNetworkBuilder([("pixels", datatypes.Array(1, 28, 28))], [("probs", datatypes.Array(10))],
                                   mode="classifier")
    builder.add_convolution("conv", kernel_channels=1, output_channels=16, height=3, width=3, stride_height=1,
                            stride_width=1, border_mode="same", groups=1, W=conv_weights(rng, 16, 1, 3),
                            b=np.zeros(16, np.float32), has_bias=True, input_name="pixels", output_name="c")
    builder.add_activation("conv_relu", "RELU", "c", "r")                                   # 16 x 28 x 28
    builder.add_pooling("pool", height=2, width=2, stride_height=2, stride_width=2, layer_type="MAX",
                        padding_type="VALID", input_name="r", output_name="p")              # 16 x 14 x 14
    builder.add_flatten("flatten", 0, "p", "flat")                                           # 3136
    builder.add_inner_product("hidden", rng.normal(0, np.sqrt(2 / 3136), (32, 3136)).astype(np.float32),
                              np.zeros(32, np.float32), 3136, 32, has_bias=True, input_name="flat",
                              output_name="h")
    builder.add_activation("hidden_relu", "RELU", "h", "a")
    builder.add_inner_product("classes", rng.normal(0, np.sqrt(1 / 32), (10, 32)).astype(np.float32),
                              np.zeros(10, np.float32), 32, 10, has_bias=True, input_name="a", output_name="scores")
    builder.add_softmax("softmax", "scores", "probs")
    builder.set_class_labels(DIGIT_LABELS, predicted_feature_name="digit", prediction_blob="probs")
    builder.make_updatable(["conv", "hidden", "classes"])
    builder.set_categorical_cross_entropy_loss(name="loss", input="probs")
    builder.set_sgd_optimizer(SgdParams(lr=0.01, batch=8, momentum=0.9))
    builder.set_epochs(3, allowed_set=[1, 2, 3, 5, 10, 20])
    widen_batch_sizes(builder.spec.neuralNetworkClassifier.updateParams.optimizer.sgdOptimizer, (8, 64))
    save(builder.spec, out, "conv-28-16-32-10.mlmodel")
    record("conv-28-16-32-10.mlmodel", "neuralNetworkClassifier", "pixels", [1, 28, 28], "double", "digit",
           ["conv", "hidden", "classes"], "benchmark conv3x3 same(16) relu max2/2 flatten(3136) dense(32) relu "
           "dense(10) softmax, random weights, CE, SGD lr 0.01 momentum 0.9 batch 8/64, no shuffle")


def digits_adam(out):
    """The digits MLP classifier trained with Adam instead of SGD."""
    builder = mlp_builder(random_mlp_weights(32, seed=13))
    builder.set_adam_optimizer(AdamParams(lr=0.01, batch=16, beta1=0.9, beta2=0.999, eps=1e-8))
    builder.set_epochs(5, allowed_set=[1, 2, 5, 10])
    builder.set_shuffle(seed=17)
    widen_batch_sizes(builder.spec.neuralNetworkClassifier.updateParams.optimizer.adamOptimizer)
    save(builder.spec, out, "digits-adam.mlmodel")
    record("digits-adam.mlmodel", "neuralNetworkClassifier", "pixels", [64], "double", "digit",
           ["hidden", "classes"], "digits MLP 64-32-10, string labels, CE, Adam lr 0.01 b1 0.9 b2 0.999 "
           "eps 1e-8, batch 16, 5 epochs, shuffle seed 17")


# ---------------------------------------------------------------------------------------------------
# Convolutional digits classifiers (a, g)

def conv_weights(rng, out_c, in_c, k):
    """He-scaled kernel in the builder's (kh, kw, in, out) layout."""
    return rng.normal(0, np.sqrt(2.0 / (in_c * k * k)), (k, k, in_c, out_c)).astype(np.float32)


def digits_conv_builder(input_name, input_shape, seed):
    """[1,28,28] -> conv3x3 same(6) -> ReLU -> max2x2/2 -> conv3x3 valid(8) -> ReLU -> avg2x2/2 -> flatten
    -> dense(32) -> ReLU -> dense(10) -> softmax; only the two dense layers updatable."""
    rng = np.random.default_rng(seed)
    builder = NeuralNetworkBuilder([(input_name, datatypes.Array(*input_shape))], [("probs", datatypes.Array(10))],
                                   mode="classifier")
    builder.add_convolution("conv1", kernel_channels=1, output_channels=6, height=3, width=3, stride_height=1,
                            stride_width=1, border_mode="same", groups=1, W=conv_weights(rng, 6, 1, 3),
                            b=np.zeros(6, np.float32), has_bias=True, input_name=input_name, output_name="c1")
    builder.add_activation("relu1", "RELU", "c1", "r1")                                  # 6 x 28 x 28
    builder.add_pooling("pool1", height=2, width=2, stride_height=2, stride_width=2, layer_type="MAX",
                        padding_type="VALID", input_name="r1", output_name="p1")          # 6 x 14 x 14
    builder.add_convolution("conv2", kernel_channels=6, output_channels=8, height=3, width=3, stride_height=1,
                            stride_width=1, border_mode="valid", groups=1, W=conv_weights(rng, 8, 6, 3),
                            b=rng.normal(0, 0.01, 8).astype(np.float32), has_bias=True,
                            input_name="p1", output_name="c2")                            # 8 x 12 x 12
    builder.add_activation("relu2", "RELU", "c2", "r2")
    builder.add_pooling("pool2", height=2, width=2, stride_height=2, stride_width=2, layer_type="AVERAGE",
                        padding_type="VALID", input_name="r2", output_name="p2")          # 8 x 6 x 6
    builder.add_flatten("flatten", 0, "p2", "flat")                                        # 288
    builder.add_inner_product("dense1", rng.normal(0, np.sqrt(2 / 288), (32, 288)).astype(np.float32),
                              np.zeros(32, np.float32), 288, 32, has_bias=True, input_name="flat",
                              output_name="d1")
    builder.add_activation("dense1_relu", "RELU", "d1", "a1")
    builder.add_inner_product("dense2", rng.normal(0, np.sqrt(1 / 32), (10, 32)).astype(np.float32),
                              np.zeros(10, np.float32), 32, 10, has_bias=True, input_name="a1",
                              output_name="scores")
    builder.add_softmax("softmax", "scores", "probs")
    builder.set_class_labels(DIGIT_LABELS, predicted_feature_name="digit", prediction_blob="probs")
    return builder


def make_conv_classifier_updatable(builder, seed):
    builder.make_updatable(["dense1", "dense2"])
    builder.set_categorical_cross_entropy_loss(name="loss", input="probs")
    builder.set_sgd_optimizer(SgdParams(lr=0.01, batch=8, momentum=0.9))
    builder.set_epochs(3, allowed_set=[1, 2, 3, 5])
    builder.set_shuffle(seed=seed)
    widen_batch_sizes(builder.spec.neuralNetworkClassifier.updateParams.optimizer.sgdOptimizer)


def digits_conv(out):
    """MNIST-shaped convolutional classifier on a double multiArray [1, 28, 28] named "image"."""
    builder = digits_conv_builder("image", (1, 28, 28), seed=21)
    make_conv_classifier_updatable(builder, seed=23)
    save(builder.spec, out, "digits-conv.mlmodel")
    record("digits-conv.mlmodel", "neuralNetworkClassifier", "image", [1, 28, 28], "double", "digit",
           ["dense1", "dense2"], "conv3x3 same(6) relu max2/2 conv3x3 valid(8) relu avg2/2 flatten(288) "
           "dense(32) relu dense(10) softmax; CE, SGD lr 0.01 momentum 0.9 batch 8, 3 epochs, shuffle seed 23")


def digits_image(out):
    """Like digits-conv but the input is a 28x28 GRAYSCALE image with a scaler: x = pixel/127.5 - 1."""
    builder = digits_conv_builder("image", (1, 28, 28), seed=31)
    builder.set_pre_processing_parameters(image_input_names=["image"], gray_bias=-1.0, image_scale=1 / 127.5)
    make_conv_classifier_updatable(builder, seed=33)
    image = builder.spec.description.input[0].type.imageType
    assert image.colorSpace == Model_pb2.ImageFeatureType.GRAYSCALE and (image.width, image.height) == (28, 28)
    save(builder.spec, out, "digits-image.mlmodel")
    record("digits-image.mlmodel", "neuralNetworkClassifier", "image", [1, 28, 28], "image GRAYSCALE 28x28",
           "digit", ["dense1", "dense2"], "as digits-conv; preprocessing scaler channelScale 1/127.5, "
           "grayBias -1 (network sees pixel/127.5 - 1); SGD lr 0.01 momentum 0.9 batch 8, 3 epochs, seed 33")


# ---------------------------------------------------------------------------------------------------
# Updatable convolutions (b)

def conv_updatable(out):
    """[1,8,8] (a digit's pixels) -> conv3x3 same stride 2 (4) -> batchnorm (frozen) -> ReLU -> conv3x3 valid (4)
    -> flatten -> dense(10) (frozen) -> softmax; both convolutions updatable, Adam. Every layer between the first
    updatable layer and the loss is one Core ML back-propagates through (this net once had a leaky ReLU and a
    reshape there, which a device refuses: see refused_leaky_relu)."""
    rng = np.random.default_rng(41)
    builder = NeuralNetworkBuilder([("image", datatypes.Array(1, 8, 8))], [("probs", datatypes.Array(10))],
                                   mode="classifier")
    builder.add_convolution("conv_a", kernel_channels=1, output_channels=4, height=3, width=3, stride_height=2,
                            stride_width=2, border_mode="same", groups=1, W=conv_weights(rng, 4, 1, 3) / 16,
                            b=rng.normal(0, 0.1, 4).astype(np.float32), has_bias=True,
                            input_name="image", output_name="ca")                          # 4 x 4 x 4
    builder.add_batchnorm("bn", 4, gamma=rng.uniform(0.5, 1.5, 4).astype(np.float32),
                          beta=rng.normal(0, 0.1, 4).astype(np.float32),
                          mean=rng.normal(0, 0.5, 4).astype(np.float32),
                          variance=rng.uniform(0.5, 2.0, 4).astype(np.float32),
                          input_name="ca", output_name="bn_out", epsilon=1e-3)
    builder.add_activation("relu", "RELU", "bn_out", "act")
    builder.add_convolution("conv_b", kernel_channels=4, output_channels=4, height=3, width=3, stride_height=1,
                            stride_width=1, border_mode="valid", groups=1, W=conv_weights(rng, 4, 4, 3),
                            b=None, has_bias=False, input_name="act", output_name="cb")     # 4 x 2 x 2
    builder.add_flatten("flatten", 0, "cb", "flat")                                       # 16
    builder.add_inner_product("classes", rng.normal(0, 0.25, (10, 16)).astype(np.float32),
                              rng.normal(0, 0.1, 10).astype(np.float32), 16, 10, has_bias=True,
                              input_name="flat", output_name="scores")
    builder.add_softmax("softmax", "scores", "probs")
    builder.set_class_labels(DIGIT_LABELS, predicted_feature_name="digit", prediction_blob="probs")
    builder.make_updatable(["conv_a", "conv_b"])
    builder.set_categorical_cross_entropy_loss(name="loss", input="probs")
    builder.set_adam_optimizer(AdamParams(lr=0.005, batch=8, beta1=0.9, beta2=0.999, eps=1e-8))
    builder.set_epochs(2, allowed_set=[1, 2, 3, 5])
    builder.set_shuffle(seed=43)
    widen_batch_sizes(builder.spec.neuralNetworkClassifier.updateParams.optimizer.adamOptimizer)
    save(builder.spec, out, "conv-updatable.mlmodel")
    record("conv-updatable.mlmodel", "neuralNetworkClassifier", "image", [1, 8, 8], "double", "digit",
           ["conv_a", "conv_b"], "conv3x3 same stride 2 (4, bias) -> batchnorm eps 1e-3 (frozen) -> ReLU "
           "-> conv3x3 valid (4, no bias) -> flatten (16) -> dense(10) (frozen: gradients pass through it) -> "
           "softmax; CE, Adam lr 0.005 batch 8, 2 epochs, shuffle seed 43; feed the 64 digit pixels as [1,8,8]")


# ---------------------------------------------------------------------------------------------------
# Shapes a device's Core ML refuses, which import must refuse too (i)

def refused_leaky_relu(out):
    """The digits MLP with a leaky ReLU between its two updatable dense layers: coremltools builds it, but
    Core ML cannot back-propagate through a leaky ReLU and a device refuses the model."""
    builder = NeuralNetworkBuilder([("pixels", datatypes.Array(64))], [("probs", datatypes.Array(10))],
                                   mode="classifier")
    w1, b1, w2, b2 = (np.asarray(a, dtype=np.float32) for a in random_mlp_weights(16, seed=81))
    builder.add_inner_product("hidden", w1, b1, 64, 16, has_bias=True, input_name="pixels", output_name="h")
    builder.add_activation("hidden_leaky", "LEAKYRELU", "h", "a", params=[0.1])
    builder.add_inner_product("classes", w2, b2, 16, 10, has_bias=True, input_name="a", output_name="scores")
    builder.add_softmax("softmax", "scores", "probs")
    builder.set_class_labels(DIGIT_LABELS, predicted_feature_name="digit", prediction_blob="probs")
    builder.make_updatable(["hidden", "classes"])
    builder.set_categorical_cross_entropy_loss(name="loss", input="probs")
    builder.set_sgd_optimizer(SgdParams(lr=0.05, batch=8))
    builder.set_epochs(5)
    save(builder.spec, out, "refused-leaky-relu.mlmodel")
    record("refused-leaky-relu.mlmodel", "refused: neuralNetworkClassifier", "pixels", [64], "double", "digit",
           ["hidden", "classes"], "64 -> dense(16) -> leaky ReLU 0.1 -> dense(10) -> softmax, both dense "
           "updatable; import must refuse it, naming 'hidden_leaky' and 'hidden'")


def refused_frozen_bias(out):
    """The digits MLP with the bias of its updatable output layer marked not updatable (coremltools'
    make_updatable marks both; this clears the bias flag afterwards): a device refuses the model."""
    builder = mlp_builder(random_mlp_weights(16, seed=83))
    builder.set_sgd_optimizer(SgdParams(lr=0.05, batch=8))
    builder.set_epochs(5)
    builder.spec.neuralNetworkClassifier.layers[2].innerProduct.bias.isUpdatable = False
    save(builder.spec, out, "refused-frozen-bias.mlmodel")
    record("refused-frozen-bias.mlmodel", "refused: neuralNetworkClassifier", "pixels", [64], "double", "digit",
           ["hidden", "classes"], "the digits MLP 64-16-10 with layer 'classes' updatable but its bias not; "
           "import must refuse it, naming 'classes'")


# ---------------------------------------------------------------------------------------------------
# Regressor (c)

def digits_regressor(out):
    """Plain neuralNetwork 64 -> dense(16) -> tanh -> dense(2) named "value", MSE loss, Adam."""
    rng = np.random.default_rng(51)
    builder = NeuralNetworkBuilder([("pixels", datatypes.Array(64))], [("value", datatypes.Array(2))])
    builder.add_inner_product("hidden", rng.normal(0, 0.05, (16, 64)).astype(np.float32),
                              np.zeros(16, np.float32), 64, 16, has_bias=True, input_name="pixels",
                              output_name="h")
    builder.add_activation("hidden_tanh", "TANH", "h", "t")
    builder.add_inner_product("head", rng.normal(0, 0.25, (2, 16)).astype(np.float32), np.zeros(2, np.float32),
                              16, 2, has_bias=True, input_name="t", output_name="value")
    builder.make_updatable(["hidden", "head"])
    # The loss reads the network output "value"; coremltools names its target "value_true" (a training input).
    builder.set_mean_squared_error_loss(name="loss", input_feature=("value", datatypes.Array(2)))
    builder.set_adam_optimizer(AdamParams(lr=0.01, batch=8))
    builder.set_epochs(5, allowed_set=[1, 2, 5, 10])
    builder.set_shuffle(seed=53)
    widen_batch_sizes(builder.spec.neuralNetwork.updateParams.optimizer.adamOptimizer)
    save(builder.spec, out, "digits-regressor.mlmodel")
    record("digits-regressor.mlmodel", "neuralNetwork", "pixels", [64], "double", "value_true",
           ["hidden", "head"], "regressor 64 -> dense(16) tanh -> dense(2) output 'value'; MSE target "
           "feature 'value_true' (double [2]); Adam lr 0.01 batch 8, 5 epochs, shuffle seed 53; suggested "
           "targets for a digit d: [d/9, (d mod 2)]")


def digit_value_regressor(out, name, mode, optimizer, seed=5):
    """64 -> dense(32) -> ReLU -> dense(1) "value", MSE against "value_true": the digit as a number. As a
    plain neuralNetwork with Adam, or (mode "regressor") a neuralNetworkRegressor with SGD and momentum."""
    rng = np.random.default_rng(seed)
    builder = NeuralNetworkBuilder([("pixels", datatypes.Array(64))], [("value", datatypes.Array(1))], mode=mode)
    builder.add_inner_product("hidden", rng.normal(0, 0.1, (32, 64)).astype(np.float32), np.zeros(32, np.float32),
                              64, 32, has_bias=True, input_name="pixels", output_name="hidden_out")
    builder.add_activation("hidden_relu", "RELU", "hidden_out", "hidden_act")
    builder.add_inner_product("head", rng.normal(0, 0.1, (1, 32)).astype(np.float32), np.zeros(1, np.float32),
                              32, 1, has_bias=True, input_name="hidden_act", output_name="value")
    builder.make_updatable(["hidden", "head"])
    builder.set_mean_squared_error_loss(name="loss", input_feature=("value", datatypes.Array(1)))
    if optimizer == "adam":
        builder.set_adam_optimizer(AdamParams(lr=0.01, batch=16, beta1=0.9, beta2=0.999, eps=1e-8))
    else:
        builder.set_sgd_optimizer(SgdParams(lr=0.001, batch=16, momentum=0.9))
    builder.set_epochs(10, allowed_set=[1, 5, 10, 20])
    builder.set_shuffle(seed=3)
    save(builder.spec, out, name)
    record(name, "neuralNetworkRegressor" if mode == "regressor" else "neuralNetwork", "pixels", [64], "double",
           "value_true", ["hidden", "head"], f"the digit as a number: 64 -> dense(32) ReLU -> dense(1) 'value', "
           f"MSE target 'value_true' (double [1]); {optimizer}, batch 16, 10 epochs, shuffle seed 3")


# ---------------------------------------------------------------------------------------------------
# k-NN (e) and pipeline (f)

def knn_builder(input_name, dims, default_label, k, weighting):
    return KNearestNeighborsClassifierBuilder(input_name=input_name, output_name="digit",
                                              number_of_dimensions=dims, default_class_label=default_label,
                                              number_of_neighbors=k, weighting_scheme=weighting,
                                              index_type="linear")


def digits_knn(out, pixels, digits):
    """Empty updatable k-NN over 64 pixels, string labels, k 3, uniform (like the shared copy), and an
    int64-labelled one with inverse-distance weighting holding six stored samples (rows 0-5)."""
    builder = knn_builder("pixels", 64, "unknown", 3, "uniform")
    save(builder.spec, out, "digits-knn.mlmodel")
    record("digits-knn.mlmodel", "kNearestNeighborsClassifier", "pixels", [64], "float32", "digit", [],
           "empty, string labels, default 'unknown', k 3, uniform, linear index")

    builder = knn_builder("pixels", 64, -1, 3, "inverse_distance")
    builder.add_samples(pixels[:6].tolist(), [int(d) for d in digits[:6]])
    assert builder.is_updatable
    save(builder.spec, out, "digits-knn-int64.mlmodel")
    record("digits-knn-int64.mlmodel", "kNearestNeighborsClassifier", "pixels", [64], "float32", "digit", [],
           "int64 labels, default -1, k 3, inverse distance, linear index; stores digits rows 0-5 "
           f"(labels {[int(d) for d in digits[:6]]})")


def digits_pipeline(out):
    """Pipeline classifier: frozen neuralNetwork 64 -> dense(16) -> ReLU ("features") feeding an empty
    updatable k-NN (string labels, k 3, uniform). The pipeline and its last model are updatable; the
    extractor is not, as in Apple's updatable drawing-classifier sample."""
    rng = np.random.default_rng(61)
    extractor = NeuralNetworkBuilder([("pixels", datatypes.Array(64))], [("features", datatypes.Array(16))])
    extractor.add_inner_product("embed", rng.normal(0, 0.1, (16, 64)).astype(np.float32),
                                rng.normal(0, 0.1, 16).astype(np.float32), 64, 16, has_bias=True,
                                input_name="pixels", output_name="embedded")
    extractor.add_activation("embed_relu", "RELU", "embedded", "features")
    extractor_spec = extractor.spec
    extractor_spec.specificationVersion = 4  # updatable models need spec 4; a pipeline's parts share it

    knn = knn_builder("features", 16, "unknown", 3, "uniform").spec

    pipeline = Model_pb2.Model()
    pipeline.specificationVersion = 4
    description = pipeline.description
    description.input.extend(extractor_spec.description.input)
    description.output.extend(knn.description.output)
    description.predictedFeatureName = knn.description.predictedFeatureName
    description.predictedProbabilitiesName = knn.description.predictedProbabilitiesName
    # Training takes the pipeline's own input and the k-NN's label, not the k-NN's internal feature input.
    description.trainingInput.extend(extractor_spec.description.input)
    description.trainingInput.extend(t for t in knn.description.trainingInput if t.name == "digit")
    models = pipeline.pipelineClassifier.pipeline.models
    models.add().CopyFrom(extractor_spec)
    models.add().CopyFrom(knn)
    pipeline.isUpdatable = True
    save(pipeline, out, "digits-pipeline.mlmodel")
    record("digits-pipeline.mlmodel", "pipelineClassifier", "pixels", [64], "double", "digit", ["k-NN (model 1)"],
           "model 0: neuralNetwork embed 64->16 + ReLU -> 'features' (frozen); model 1: empty updatable k-NN "
           "on 'features' (float32 [16]), string labels, default 'unknown', k 3, uniform, linear index")


# ---------------------------------------------------------------------------------------------------
# A linked pipeline (i), built as coremltools' examples/updatable_models/updatable_linked_model.ipynb builds
# its tiny drawing classifier: an image-input drawing embedding saved on its own, and beside it a
# pipelineClassifier whose first model is a linkedModel naming the embedding's compiled file and whose
# second is an empty updatable k-NN with default label "unknown".

EMBEDDING_FILE = "DrawingEmbedding.mlmodel"
LINKED_PIPELINE_FILE = "LinkedDrawingClassifier.mlmodel"
EMBEDDING_SCALE = 16 / 255  # 8-bit pixels back to the digits' 0..16 range


def drawing_embedding(out, pixels, digits):
    """8x8 GRAYSCALE image 'drawing' -> scaler 16/255 -> flatten -> dense(32) -> ReLU 'embedding' (FLOAT32
    [32]): the hidden layer of a 64-32-10 digits classifier trained in NumPy on rows 0-1199, its last layer
    removed (as the notebook's embedding is a Quick, Draw! classifier without its last layer)."""
    rng = np.random.default_rng(83)
    start = [rng.normal(0, 0.05, (32, 64)), np.zeros(32), rng.normal(0, 0.1, (10, 32)), np.zeros(10)]
    x_base, t_base = pixels[BASE_ROWS[0]:BASE_ROWS[1]], digits[BASE_ROWS[0]:BASE_ROWS[1]]
    w1, b1, w2, b2 = train_mlp(start, x_base, t_base, epochs=3, lr=0.01, batch=32, momentum=0.9,
                               order_source=np.random.default_rng(89).permutation)
    accuracy = float(np.mean(mlp_predict([w1, b1, w2, b2], pixels[1200:]) == digits[1200:]))
    builder = NeuralNetworkBuilder([("drawing", datatypes.Array(1, 8, 8))], [("embedding", datatypes.Array(32))])
    builder.add_flatten("flatten", 0, "drawing", "flat")
    builder.add_inner_product("embed", w1.astype(np.float32), b1.astype(np.float32), 64, 32, has_bias=True,
                              input_name="flat", output_name="embedded")
    builder.add_activation("embed_relu", "RELU", "embedded", "embedding")
    builder.set_pre_processing_parameters(image_input_names=["drawing"], image_scale=EMBEDDING_SCALE)
    spec = builder.spec
    spec.specificationVersion = 4
    spec.description.output[0].type.multiArrayType.dataType = Model_pb2.ArrayFeatureType.FLOAT32
    spec.description.input[0].shortDescription = "Drawing, white strokes on black"
    spec.description.output[0].shortDescription = "Embedding of the drawing in 32 dimensions"
    spec.description.metadata.shortDescription = ("Embeds an 8x8 grayscale drawing: the hidden layer of a digits "
                                                  "classifier trained on other writers")
    image = spec.description.input[0].type.imageType
    assert image.colorSpace == Model_pb2.ImageFeatureType.GRAYSCALE and (image.width, image.height) == (8, 8)
    save(spec, out, EMBEDDING_FILE)
    record(EMBEDDING_FILE, "neuralNetwork", "drawing", [1, 8, 8], "image GRAYSCALE 8x8", None, [],
           "frozen (not updatable): scaler channelScale 16/255, flatten, dense 64->32 'embed', ReLU -> 'embedding' "
           "FLOAT32 [32]; weights of a 64-32-10 MLP trained in NumPy on rows 0-1199 (3 epochs, SGD lr 0.01 "
           f"momentum 0.9 batch 32; that classifier's accuracy on rows 1200+: {accuracy:.3f})")
    return spec


def digits_pretrained_v2(out, pixels, digits):
    """The digits base retrained, as a team ships a better base: a wider hidden layer (64-48-10) trained on
    the same rows 0-1199 for 4 epochs. Same input, label and classes as digits-pretrained, so users' kept
    samples can be replayed onto it (`attune model rebase`, the demo); the update defaults are the same."""
    rng = np.random.default_rng(83)
    start = [rng.normal(0, 0.05, (48, 64)), np.zeros(48), rng.normal(0, 0.1, (10, 48)), np.zeros(10)]
    x_base, t_base = pixels[BASE_ROWS[0]:BASE_ROWS[1]], digits[BASE_ROWS[0]:BASE_ROWS[1]]
    weights = train_mlp(start, x_base, t_base, epochs=4, lr=0.01, batch=32, momentum=0.9,
                        order_source=np.random.default_rng(89).permutation)
    save(pretrained_builder(weights).spec, out, "digits-pretrained-v2.mlmodel")
    stored = [np.asarray(w, dtype=np.float32).astype(np.float64) for w in weights]
    held = np.concatenate([np.arange(ha, hb) for _, _, (ha, hb) in user_blocks(len(digits))])
    accuracy = float(np.mean(mlp_predict(stored, pixels[held]) == digits[held]))
    record("digits-pretrained-v2.mlmodel", "neuralNetworkClassifier", "pixels", [64], "double", "digit",
           ["hidden", "classes"], "digits MLP 64-48-10 (string labels) trained in NumPy on rows 0-1199 (4 epochs, "
           f"SGD lr 0.01 momentum 0.9 batch 32); update defaults as digits-pretrained; base accuracy on all users' "
           f"held-out rows {accuracy:.4f}")


def linked_drawing_classifier(out, embedding_spec):
    """The notebook's construction with our embedding: linked model -> updatable k-NN (k 3, inverse distance,
    default 'unknown', label feature 'label')."""
    linked = Model_pb2.Model()
    linked.specificationVersion = 4  # coremltools._MINIMUM_LINKED_MODELS_SPEC_VERSION
    linked.description.metadata.shortDescription = "Linked model which points to the DrawingEmbedding model."
    linked.description.input.extend(embedding_spec.description.input[:])
    linked.description.output.extend(embedding_spec.description.output[:])
    linked.linkedModel.linkedModelFile.linkedModelFileName.defaultValue = "DrawingEmbedding.mlmodelc"
    linked.linkedModel.linkedModelFile.linkedModelSearchPath.defaultValue = ".:$BUNDLE_MAIN"

    knn = KNearestNeighborsClassifierBuilder(input_name="embedding", output_name="label", number_of_dimensions=32,
                                             default_class_label="unknown", number_of_neighbors=3,
                                             weighting_scheme="inverse_distance", index_type="linear").spec
    knn.specificationVersion = 4

    pipeline = Model_pb2.Model()
    pipeline.specificationVersion = 4
    pipeline.isUpdatable = True
    pipeline.description.input.extend(linked.description.input[:])
    pipeline.description.output.extend(knn.description.output[:])
    pipeline.description.predictedFeatureName = knn.description.predictedFeatureName
    pipeline.description.predictedProbabilitiesName = knn.description.predictedProbabilitiesName
    pipeline.description.trainingInput.extend([linked.description.input[0]])
    pipeline.description.trainingInput[0].shortDescription = "Example drawing"
    pipeline.description.trainingInput.extend([knn.description.output[0]])
    pipeline.description.trainingInput[1].shortDescription = "Its true label"
    pipeline.description.metadata.shortDescription = "Learns to classify 8x8 drawings from a user's examples"
    pipeline.pipelineClassifier.pipeline.models.add().CopyFrom(linked)
    pipeline.pipelineClassifier.pipeline.models.add().CopyFrom(knn)
    save(pipeline, out, LINKED_PIPELINE_FILE)
    record(LINKED_PIPELINE_FILE, "pipelineClassifier", "drawing", [1, 8, 8], "image GRAYSCALE 8x8", "label",
           ["k-NN (model 1)"], "model 0: linkedModel 'DrawingEmbedding.mlmodelc' (search path '.:$BUNDLE_MAIN') "
           "with DrawingEmbedding's interface; model 1: empty updatable k-NN on 'embedding' (FLOAT32 [32]), "
           "string labels, default 'unknown', k 3, inverse distance, linear index")


# ---------------------------------------------------------------------------------------------------
# Pretrained base (h)

def softmax_rows(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def mlp_predict(weights, x):
    w1, b1, w2, b2 = weights
    return softmax_rows(np.maximum(x @ w1.T + b1, 0) @ w2.T + b2).argmax(axis=1)


def train_mlp(weights, x, t, epochs, lr, batch, momentum, order_source):
    """Mini-batch SGD with momentum on mean cross-entropy (float64); order_source(n) gives each epoch's order."""
    params = [np.array(w, dtype=np.float64) for w in weights]
    velocity = [np.zeros_like(p) for p in params]
    for _ in range(epochs):
        order = order_source(len(t))
        for start in range(0, len(t), batch):
            idx = order[start:start + batch]
            w1, b1, w2, b2 = params
            xb, tb = x[idx], t[idx]
            pre = xb @ w1.T + b1
            act = np.maximum(pre, 0)
            d = softmax_rows(act @ w2.T + b2)
            d[np.arange(len(tb)), tb] -= 1
            d /= len(tb)
            d_act = (d @ w2) * (pre > 0)
            grads = [d_act.T @ xb, d_act.sum(0), d.T @ act, d.sum(0)]
            for v, g, p in zip(velocity, grads, params):
                v *= momentum
                v -= lr * g
                p += v
    return params


def splitmix_orders(seed):
    """Epoch orders as the engine draws them (SplitMix64 + Fisher-Yates, reference_sgd.py), one generator."""
    sys.path.insert(0, HERE)
    from reference_sgd import SplitMix64, shuffle_in_place
    rng = SplitMix64(seed)
    state = {}

    def next_order(n):
        order = state.setdefault("order", list(range(n)))
        shuffle_in_place(order, rng)
        return np.array(order)
    return next_order


# The update defaults of the pretrained digits bases (lr, mini-batch, momentum, epochs, shuffle seed): what a
# user's job runs with unless it says otherwise.
PRETRAINED_UPDATE = (0.002, 8, 0.9, 10, 79)


def pretrained_builder(weights):
    """A pretrained digits base as users get it: the MLP with these weights and the update defaults above."""
    lr, batch, momentum, epochs, seed = PRETRAINED_UPDATE
    builder = mlp_builder(weights)
    builder.set_sgd_optimizer(SgdParams(lr=lr, batch=batch, momentum=momentum))
    builder.set_epochs(epochs, allowed_set=[1, 2, 5, 10, 20])
    builder.set_shuffle(seed=seed)
    widen_batch_sizes(builder.spec.neuralNetworkClassifier.updateParams.optimizer.sgdOptimizer)
    return builder


def digits_pretrained(out, pixels, digits):
    """Digits MLP 64-32-10 whose weights were trained on rows 0-1199 ("other writers"); users are the later
    row blocks. Deliberately one short epoch, so the base is decent but leaves room for a personal update."""
    rng = np.random.default_rng(71)
    start = [rng.normal(0, 0.05, (32, 64)), np.zeros(32), rng.normal(0, 0.1, (10, 32)), np.zeros(10)]
    x_base, t_base = pixels[BASE_ROWS[0]:BASE_ROWS[1]], digits[BASE_ROWS[0]:BASE_ROWS[1]]
    base_rng = np.random.default_rng(73)
    weights = train_mlp(start, x_base, t_base, epochs=1, lr=0.01, batch=32, momentum=0.9,
                        order_source=base_rng.permutation)
    lr, batch, momentum, epochs, seed = PRETRAINED_UPDATE
    save(pretrained_builder(weights).spec, out, "digits-pretrained.mlmodel")

    # What a per-user update should do, simulated in float64 with the model's own defaults and shuffle rule
    # (float32 weights as stored, since that is what the engine starts from).
    stored = [np.asarray(w, dtype=np.float32).astype(np.float64) for w in weights]
    users = []
    for k, (ta, tb), (ha, hb) in user_blocks(len(digits)):
        before = float(np.mean(mlp_predict(stored, pixels[ha:hb]) == digits[ha:hb]))
        personal = train_mlp(stored, pixels[ta:tb], digits[ta:tb], epochs, lr, batch, momentum,
                             splitmix_orders(seed))
        after = float(np.mean(mlp_predict(personal, pixels[ha:hb]) == digits[ha:hb]))
        users.append({"user": k, "train_rows": [ta, tb], "held_out_rows": [ha, hb],
                      "base_accuracy": round(before, 4), "reference_accuracy_after_update": round(after, 4)})
    held = np.concatenate([np.arange(ha, hb) for _, _, (ha, hb) in user_blocks(len(digits))])
    base_accuracy = float(np.mean(mlp_predict(stored, pixels[held]) == digits[held]))
    record("digits-pretrained.mlmodel", "neuralNetworkClassifier", "pixels", [64], "double", "digit",
           ["hidden", "classes"], "digits MLP 64-32-10 (string labels) trained in NumPy on rows 0-1199 (1 epoch, "
           f"SGD lr 0.01 momentum 0.9 batch 32); update defaults SGD lr {lr} momentum {momentum} batch {batch}, "
           f"{epochs} epochs, shuffle seed {seed}; base accuracy on all users' held-out rows {base_accuracy:.4f}")
    MANIFEST["digits_blocks"] = {
        "file": "examples/data/digits.csv.gz (64 pixels then the label per row, no header)",
        "base_rows": list(BASE_ROWS),
        "users": users,
        "notes": "user k: rows 1200+100k .. +99 (the last user is shorter); first 60 train, the rest held out. "
                 "reference_accuracy_after_update: NumPy float64 update with the model's defaults "
                 "(SplitMix64 shuffle from the model seed, fresh per user).",
    }


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    os.makedirs(out, exist_ok=True)
    with contextlib.redirect_stdout(io.StringIO()):  # the builder announces every loss target it adds
        build_all(out)
    print("wrote", sorted(f for f in os.listdir(out) if f.endswith(".mlmodel")))
    blocks = MANIFEST["digits_blocks"]["users"]
    print("pretrained base, held-out accuracy per user before -> NumPy update after:",
          ", ".join(f"{u['user']}: {u['base_accuracy']:.3f} -> {u['reference_accuracy_after_update']:.3f}"
                    for u in blocks))


def build_all(out):
    digits_mlp(os.path.join(out, "digits-mlp.mlmodel"))
    digits_mlp(os.path.join(out, "digits-mlp-int64.mlmodel"), hidden=16, int64_labels=True)
    record("digits-mlp.mlmodel", "neuralNetworkClassifier", "pixels", [64], "double", "digit",
           ["hidden", "classes"], "digits MLP 64-32-10, string labels, CE, SGD lr 0.05 batch 16, 5 epochs, seed 7")
    record("digits-mlp-int64.mlmodel", "neuralNetworkClassifier", "pixels", [64], "double", "digit",
           ["hidden", "classes"], "digits MLP 64-16-10, int64 labels 0-9, CE, SGD lr 0.05 batch 16, 5 epochs")
    pixels, digits = load_digits()
    digits_conv(out)
    conv_updatable(out)
    digits_regressor(out)
    digit_value_regressor(out, "digit-value.mlmodel", None, "adam")
    digit_value_regressor(out, "digit-value-sgd.mlmodel", "regressor", "sgd")
    digits_adam(out)
    digits_knn(out, pixels, digits)
    digits_pipeline(out)
    digits_image(out)
    refused_leaky_relu(out)
    refused_frozen_bias(out)
    digits_pretrained(out, pixels, digits)
    digits_pretrained_v2(out, pixels, digits)
    linked_drawing_classifier(out, drawing_embedding(out, pixels, digits))
    bench_mlp(out, 64, 32)
    bench_mlp(out, 784, 128)
    bench_conv(out)
    with open(os.path.join(out, "fixtures.json"), "w") as f:
        json.dump(MANIFEST, f, indent=1)


if __name__ == "__main__":
    main()
