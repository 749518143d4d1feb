"""The LeNet-like CNN of tfpipe's `--model cnn`, built in Keras, for the Keras side of each
comparison (scripts/keras_cnn.py: step time; scripts/keras_digits_png.py: accuracy), so that
both measure the same model.

Input(28, 28, 1) -> Conv2D(6, 5, same, relu) -> MaxPool(2) -> Conv2D(16, 5, valid, relu)
-> MaxPool(2) -> Flatten (400) -> Dense(120, relu) -> Dense(84, relu) -> Dense(10) (logits).
Other input shapes and class counts (scripts/keras_photos.py: 64x64x3, 9 classes) change only
the input and the last layer, as `--model cnn` does.
"""
import keras


def lenet(shape=(28, 28, 1), classes=10):
    """The uncompiled model; the caller compiles it (optimizer, loss, metrics)."""
    inputs = keras.Input(shape=shape)
    h = keras.layers.Conv2D(6, 5, padding="same", activation="relu")(inputs)
    h = keras.layers.MaxPooling2D(2)(h)
    h = keras.layers.Conv2D(16, 5, activation="relu")(h)
    h = keras.layers.MaxPooling2D(2)(h)
    h = keras.layers.Flatten()(h)
    h = keras.layers.Dense(120, activation="relu")(h)
    h = keras.layers.Dense(84, activation="relu")(h)
    return keras.Model(inputs, keras.layers.Dense(classes)(h))
