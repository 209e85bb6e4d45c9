"""Keras 3 on the JAX backend as Keras's distribution guide writes it:
`set_distribution(DataParallel(...))`, a small Sequential MLP compiled with Adam,
and `model.fit` with a callback timing each epoch. Synthetic data; prints one
JSON line of results."""

import os

os.environ["KERAS_BACKEND"] = "jax"

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402


class EpochTimer(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.epoch_s = []

    def on_epoch_begin(self, epoch, logs=None):
        self.started = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        # A sync per step (see README). Reading `self.model` reattaches the
        # step's new state to the model's variables; wait for those.
        jax.block_until_ready([v.value for v in self.model.trainable_variables])

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_s.append(time.perf_counter() - self.started)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=64)
    args = parser.parse_args()

    keras.utils.set_random_seed(0)
    keras.distribution.set_distribution(keras.distribution.DataParallel(devices=jax.devices()))
    rng = np.random.RandomState(0)
    x = rng.rand(args.samples, 784).astype(np.float32)
    y = rng.randint(0, 10, args.samples).astype(np.int32)

    model = keras.Sequential(
        [
            keras.Input(shape=(784,)),
            keras.layers.Dense(args.hidden, activation="relu"),
            keras.layers.Dense(args.hidden, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate=1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    timer = EpochTimer()
    history = model.fit(
        x,
        y,
        epochs=args.epochs,
        batch_size=args.batch_size,
        verbose=0,
        shuffle=False,
        callbacks=[timer],
    )
    flat = np.concatenate([np.ravel(np.asarray(w)) for w in model.get_weights()])
    result = {
        "loss": float(history.history["loss"][-1]),
        "accuracy": float(history.history["accuracy"][-1]),
        "params": flat[:: max(1, flat.size // 512)].tolist(),
        "epoch_s": timer.epoch_s,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
