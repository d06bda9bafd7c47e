"""The Keras GELU site finder on real Keras 3 models, read from their traced TF graph."""

import keras
import pytest
import tensorflow as tf

from verifiers.gelu import (
    EXACT,
    QUICK,
    RELU,
    TANH,
    UNKNOWN,
    find_keras_relu_sites,
    find_keras_sites,
)

SIGNATURE = [tf.TensorSpec([None, 8], tf.float32)]


def quick_gelu(x):
    return x * keras.ops.sigmoid(1.702 * x)


def mlp(activation):
    """Dense -> activation layer -> Dense on an (n, 8) input."""
    inputs = keras.Input((8,))
    hidden = activation(keras.layers.Dense(16)(inputs))
    return keras.Model(inputs, keras.layers.Dense(8)(hidden))


def traced_ops(model, signature=SIGNATURE):
    """{node name: op type} of the model's traced graph (its top level), to read what a site's nodes
    are without depending on the names TensorFlow gives them."""
    concrete = tf.function(lambda *a: model(a[0] if len(a) == 1 else list(a), training=False)).get_concrete_function(
        *signature)
    return {node.name: node.op for node in concrete.graph.as_graph_def().node}


@pytest.mark.parametrize(
    ("activation", "op", "claimed"),
    [
        pytest.param(lambda: keras.layers.Activation("gelu"), "erf-chain", EXACT, id="Activation-gelu"),
        pytest.param(lambda: keras.layers.Activation(keras.activations.gelu), "erf-chain", EXACT,
                     id="activations.gelu"),
        pytest.param(lambda: keras.layers.Lambda(lambda x: keras.activations.gelu(x, approximate=True)),
                     "tanh-chain", TANH, id="activations.gelu-approximate"),
        pytest.param(lambda: keras.layers.Lambda(keras.ops.gelu), "tanh-chain", TANH, id="ops.gelu"),
        pytest.param(lambda: keras.layers.Lambda(tf.nn.gelu), "erf-chain", EXACT, id="tf.nn.gelu"),
        pytest.param(lambda: keras.layers.Lambda(lambda x: tf.nn.gelu(x, approximate=True)), "tanh-chain", TANH,
                     id="tf.nn.gelu-approximate"),
        pytest.param(lambda: keras.layers.Lambda(quick_gelu), "sigmoid-chain", QUICK, id="quick_gelu"),
    ],
)
def test_finds_the_one_gelu_between_the_dense_layers(activation, op, claimed):
    model = mlp(activation())
    [site] = find_keras_sites(model, SIGNATURE)
    assert (site.op, site.claimed) == (op, claimed)
    assert site.site_id == f"0:{site.nodes[0]}"
    assert traced_ops(model)[site.input] == "BiasAdd"  # the first Dense's output
    assert site.note == "constants match"


def test_exact_gelu_is_the_erfc_form():
    model = mlp(keras.layers.Activation("gelu"))
    [site] = find_keras_sites(model, SIGNATURE)
    ops = traced_ops(model)
    assert [ops[name] for name in site.nodes] == ["Mul", "Neg", "Mul", "Erfc", "Mul"]


def test_dense_with_gelu_activation_is_a_site_after_its_bias_add():
    inputs = keras.Input((8,))
    model = keras.Model(inputs, keras.layers.Dense(8, activation="gelu")(inputs))
    [site] = find_keras_sites(model, SIGNATURE)
    assert (site.op, site.claimed) == ("erf-chain", EXACT)
    ops = traced_ops(model)
    assert ops[site.input] == "BiasAdd" and list(ops.values()).count("BiasAdd") == 1  # the layer's own bias add


def test_mixed_flavours_come_back_in_graph_order():
    model = keras.Sequential([
        keras.Input((8,)),
        keras.layers.Dense(8, activation="gelu"),
        keras.layers.Lambda(keras.ops.gelu),
        keras.layers.Lambda(quick_gelu),
        keras.layers.Lambda(lambda x: 0.5 * x * (1 + keras.ops.tanh(0.7978845608 * (x + 0.0447 * x**3)))),
    ])
    found = find_keras_sites(model, SIGNATURE)
    assert [(s.op, s.claimed) for s in found] == [
        ("erf-chain", EXACT), ("tanh-chain", TANH), ("sigmoid-chain", QUICK), ("tanh-chain", UNKNOWN)]
    assert [s.site_id.split(":")[0] for s in found] == ["0", "1", "2", "3"]
    assert [s.input for s in found[1:]] == [s.output for s in found[:-1]]
    assert "cubic coeff 0.0447" in found[3].note


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_constants_are_judged_at_their_precision(policy):
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, activation="gelu", dtype=policy),
                              keras.layers.Lambda(keras.ops.gelu, dtype=policy)])
    assert [s.claimed for s in find_keras_sites(model, SIGNATURE)] == [EXACT, TANH]


@pytest.mark.parametrize(
    "activation",
    [pytest.param("relu", id="relu"), pytest.param("silu", id="silu"), pytest.param("tanh", id="tanh"),
     pytest.param("sigmoid", id="sigmoid")],
)
def test_models_without_gelu_have_no_sites(activation):
    assert find_keras_sites(mlp(keras.layers.Activation(activation)), SIGNATURE) == []


def test_gelu_inside_a_called_tf_function_is_found():
    @tf.function
    def helper(x):
        return tf.nn.gelu(x, approximate=True)

    class Helper(keras.layers.Layer):
        def call(self, x):
            return helper(x)

    model = mlp(Helper())
    [site] = find_keras_sites(model, SIGNATURE)
    assert (site.op, site.claimed) == ("tanh-chain", TANH)
    ops = traced_ops(model)
    assert not set(site.nodes) & set(ops)  # read from the called function's body, not the caller's graph
    assert ops[site.input] == "BiasAdd" and site.output not in ops


def test_multi_input_models_are_traced_with_a_list():
    a, b = keras.Input((8,)), keras.Input((8,))
    model = keras.Model([a, b], keras.layers.Activation("gelu")(keras.layers.Add()([a, b])))
    [site] = find_keras_sites(model, SIGNATURE * 2)
    assert site.claimed == EXACT


def test_relu_helper_lists_relu_ops():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, activation="relu"), keras.layers.ReLU(),
                              keras.layers.Activation("gelu"), keras.layers.Activation("relu")])
    found = find_keras_relu_sites(model, SIGNATURE)
    assert [(s.op, s.claimed) for s in found] == [("Relu", RELU)] * 3
    assert [s.site_id.split(":")[:2] for s in found] == [["relu", "0"], ["relu", "1"], ["relu", "2"]]
    assert [s.claimed for s in find_keras_sites(model, SIGNATURE)] == [EXACT]
