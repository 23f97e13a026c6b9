#!/usr/bin/env python3
"""TensorFlow-converted styles for the style corpus (models/make_style_models.py): a small Keras CNN (NHWC
Conv2D+BatchNormalization+ReLU, MaxPool, GlobalAveragePooling, Dense) and a tiny Keras text block (Embedding,
Dense, LayerNormalization, erf-GELU written out: Keras' own gelu becomes Erfc, which tf2onnx cannot convert), converted with tf2onnx at opset 13 and 17. TensorFlow is not a dependency of
onnxfuse: run this in a separate environment; the outputs are committed in models/styles_tf/.

    python3 -m venv /tmp/tfvenv && /tmp/tfvenv/bin/pip install tensorflow-cpu tf2onnx   (tested: TF 2.21, tf2onnx 1.17)
    /tmp/tfvenv/bin/python models/make_tf_style_models.py [OUT_DIR]      (default: models/styles_tf/)
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf2onnx  # noqa: E402


def cnn():
    tf.keras.utils.set_random_seed(0)
    x = inp = tf.keras.Input(shape=(16, 16, 3), name="input")
    for ch in (8, 16):
        x = tf.keras.layers.Conv2D(ch, 3, padding="same")(x)
        x = tf.keras.layers.BatchNormalization()(x)
        x = tf.keras.layers.ReLU()(x)
        x = tf.keras.layers.MaxPooling2D()(x)
    x = tf.keras.layers.GlobalAveragePooling2D()(x)
    return tf.keras.Model(inp, tf.keras.layers.Dense(10)(x))


def text():
    tf.keras.utils.set_random_seed(0)
    ids = tf.keras.Input(shape=(None,), dtype="int32", name="input_ids")
    x = tf.keras.layers.Embedding(32, 32)(ids)
    h = tf.keras.layers.Dense(64, activation=lambda t: 0.5 * t * (1.0 + tf.math.erf(t / 1.4142135)))(x)
    x = tf.keras.layers.LayerNormalization(epsilon=1e-6)(x + tf.keras.layers.Dense(32)(h))
    return tf.keras.Model(ids, x)


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "styles_tf")
    os.makedirs(out, exist_ok=True)
    for name, model in (("keras_cnn_nhwc", cnn()), ("keras_text_block", text())):
        for v in model.weights:  # nonzero BN statistics / biases so a dropped term shows in validation
            if len(v.shape) == 1:
                v.assign(tf.abs(v + tf.random.normal(v.shape, stddev=0.1, seed=1)) + (0.5 if "variance" in v.name else 0))
        spec = [tf.TensorSpec(i.shape, i.dtype, name=i.name.split(":")[0]) for i in model.inputs]
        fn = tf.function(lambda *a, m=model: m(list(a) if len(a) > 1 else a[0]))
        for opset in (13, 17):
            path = os.path.join(out, f"{name}_tf2onnx_op{opset}.onnx")
            tf2onnx.convert.from_function(fn, input_signature=spec, opset=opset, output_path=path)
            print(path, os.path.getsize(path))


if __name__ == "__main__":
    np.random.seed(0)
    main()
