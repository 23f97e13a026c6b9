#!/usr/bin/env python3
"""Export small Keras models with tf2onnx (random weights, nothing downloaded): a text encoder (Embedding,
keras.layers.MultiHeadAttention with a padding mask, LayerNormalization, Dense with tanh-GELU) and a ViT-style
image encoder (Conv2D patches, pre-norm blocks, exact GELU), 2 layers, hidden 64, 4 heads, opset 17.

Usage (TensorFlow is not a dependency of onnxfuse; use a separate environment)::

    python3.11 -m venv /tmp/tfenv && /tmp/tfenv/bin/pip install "tensorflow-cpu==2.15.1" "tf2onnx==1.16.1"
    /tmp/tfenv/bin/python -m corpora.keras_encoders /tmp/keras
    python -m benchmarks.family_table /tmp/keras/*.onnx --tools onnxfuse

writes ``keras_encoder_tf2onnx17.onnx`` and ``keras_vit_tf2onnx17.onnx`` (0.5 MB each). Every 1-D weight
(biases, norm parameters) gets N(0, 0.1) noise so that a fusion that drops one cannot pass validation.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402
import tf2onnx  # noqa: E402


def encoder(vocab: int = 128, hidden: int = 64, heads: int = 4, ffn: int = 128, layers: int = 2):
    tf.random.set_seed(0)
    ids = tf.keras.Input(shape=(None,), dtype="int32", name="input_ids")
    mask = tf.keras.Input(shape=(None,), dtype="int32", name="attention_mask")
    x = tf.keras.layers.Embedding(vocab, hidden)(ids)
    x = x + tf.keras.layers.Embedding(512, hidden)(tf.range(tf.shape(ids)[1])[None])
    padding = tf.cast(mask[:, None, :], "bool")
    for _ in range(layers):
        a = tf.keras.layers.MultiHeadAttention(heads, hidden // heads)(x, x, attention_mask=padding)
        x = tf.keras.layers.LayerNormalization(epsilon=1e-6)(x + a)
        f = tf.keras.layers.Dense(ffn, activation=lambda t: tf.keras.activations.gelu(t, approximate=True))(x)
        x = tf.keras.layers.LayerNormalization(epsilon=1e-6)(x + tf.keras.layers.Dense(hidden)(f))
    return tf.keras.Model([ids, mask], x)


def vit(image: int = 32, patch: int = 8, hidden: int = 64, heads: int = 4, ffn: int = 128, layers: int = 2):
    tf.random.set_seed(0)
    px = tf.keras.Input(shape=(image, image, 3), name="pixel_values")
    x = tf.keras.layers.Conv2D(hidden, patch, strides=patch)(px)
    x = tf.keras.layers.Reshape(((image // patch) ** 2, hidden))(x)
    for _ in range(layers):
        h = tf.keras.layers.LayerNormalization(epsilon=1e-6)(x)
        x = x + tf.keras.layers.MultiHeadAttention(heads, hidden // heads)(h, h)
        h = tf.keras.layers.Dense(ffn, activation="gelu")(tf.keras.layers.LayerNormalization(epsilon=1e-6)(x))
        x = x + tf.keras.layers.Dense(hidden)(h)
    return tf.keras.Model(px, x)


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    os.makedirs(out, exist_ok=True)
    for name, model in (("keras_encoder", encoder()), ("keras_vit", vit())):
        for v in model.weights:
            if len(v.shape) == 1:
                v.assign(v + tf.random.normal(v.shape, stddev=0.1, seed=1))
        spec = [tf.TensorSpec(i.shape, i.dtype, name=i.name) for i in model.inputs]
        path = os.path.join(out, f"{name}_tf2onnx17.onnx")
        tf2onnx.convert.from_keras(model, input_signature=spec, opset=17, output_path=path)
        print("wrote", path)


if __name__ == "__main__":
    main()
