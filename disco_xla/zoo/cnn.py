"""Convolutional networks in dm-haiku: ResNet-50, VGG-19 and Inception-v3.

`size="full"` is the published architecture for 224x224 (299x299 for Inception)
ImageNet inputs; `size="tiny"` keeps the topology with small widths and depths
for the tests. Each builder returns a function `(images, is_training) -> logits`
to be wrapped by `hk.transform_with_state` (batch norm keeps running statistics).
"""

from __future__ import annotations

import haiku as hk
import jax
import jax.numpy as jnp

# ---------------------------------------------------------------- ResNet-50
# He et al. 2016, bottleneck blocks (3, 4, 6, 3); haiku's own implementation.


def resnet50(size: str, num_classes: int):
    def forward(images, is_training):
        if size == "full":
            net = hk.nets.ResNet50(num_classes)
        else:
            net = hk.nets.ResNet(
                blocks_per_group=(1, 1, 1, 1),
                num_classes=num_classes,
                bottleneck=True,
                channels_per_group=(16, 32, 64, 128),
                use_projection=(True, True, True, True),
                name="resnet_tiny",
            )
        return net(images, is_training=is_training)

    return forward


# ---------------------------------------------------------------- VGG-19
# Simonyan & Zisserman 2015, configuration E: 16 conv 3x3 layers, 3 dense layers.
_VGG19 = (64, 64, "pool", 128, 128, "pool", 256, 256, 256, 256, "pool")
_VGG19 += (512, 512, 512, 512, "pool", 512, 512, 512, 512, "pool")


def vgg19(size: str, num_classes: int):
    width = 1 if size == "full" else 16
    dense = 4096 if size == "full" else 64

    def forward(images, is_training):
        del is_training  # no batch norm or dropout in this step
        x = images
        for layer in _VGG19:
            if layer == "pool":
                x = hk.max_pool(x, window_shape=(2, 2, 1), strides=(2, 2, 1), padding="VALID")
            else:
                x = jax.nn.relu(hk.Conv2D(layer // width, kernel_shape=3, padding="SAME")(x))
        x = hk.Flatten()(x)
        x = jax.nn.relu(hk.Linear(dense)(x))
        x = jax.nn.relu(hk.Linear(dense)(x))
        return hk.Linear(num_classes)(x)

    return forward


# ---------------------------------------------------------------- Inception-v3
# Szegedy et al. 2016, as laid out by keras.applications.InceptionV3 (no auxiliary
# head): convolutions without bias, each followed by batch norm with an offset and
# no scale, then ReLU.


def inception_v3(size: str, num_classes: int):
    divisor = 1 if size == "full" else 8

    def forward(images, is_training):
        def conv(x, filters, kernel, stride=1, padding="SAME"):
            x = hk.Conv2D(
                max(filters // divisor, 4),
                kernel_shape=kernel,
                stride=stride,
                padding=padding,
                with_bias=False,
            )(x)
            x = hk.BatchNorm(create_scale=False, create_offset=True, decay_rate=0.99)(
                x, is_training
            )
            return jax.nn.relu(x)

        def avg_pool(x):
            return hk.avg_pool(x, window_shape=(3, 3, 1), strides=(1, 1, 1), padding="SAME")

        def max_pool(x):
            return hk.max_pool(x, window_shape=(3, 3, 1), strides=(2, 2, 1), padding="VALID")

        x = conv(images, 32, 3, stride=2, padding="VALID")
        x = conv(x, 32, 3, padding="VALID")
        x = conv(x, 64, 3)
        x = max_pool(x)
        x = conv(x, 80, 1, padding="VALID")
        x = conv(x, 192, 3, padding="VALID")
        x = max_pool(x)
        # Three 35x35 blocks (the pool branch widens from 32 to 64).
        for pool_filters in (32, 64, 64):
            branch1 = conv(x, 64, 1)
            branch5 = conv(conv(x, 48, 1), 64, 5)
            branch3 = conv(conv(conv(x, 64, 1), 96, 3), 96, 3)
            pooled = conv(avg_pool(x), pool_filters, 1)
            x = jnp.concatenate([branch1, branch5, branch3, pooled], axis=-1)
        # Reduction to 17x17.
        branch3 = conv(x, 384, 3, stride=2, padding="VALID")
        branch3dbl = conv(conv(conv(x, 64, 1), 96, 3), 96, 3, stride=2, padding="VALID")
        x = jnp.concatenate([branch3, branch3dbl, max_pool(x)], axis=-1)
        # Four 17x17 blocks with factorised 7x7 convolutions.
        for middle in (128, 160, 160, 192):
            branch1 = conv(x, 192, 1)
            branch7 = conv(conv(conv(x, middle, 1), middle, (1, 7)), 192, (7, 1))
            branch7dbl = conv(x, middle, 1)
            for filters, kernel in ((middle, (7, 1)), (middle, (1, 7)), (middle, (7, 1))):
                branch7dbl = conv(branch7dbl, filters, kernel)
            branch7dbl = conv(branch7dbl, 192, (1, 7))
            pooled = conv(avg_pool(x), 192, 1)
            x = jnp.concatenate([branch1, branch7, branch7dbl, pooled], axis=-1)
        # Reduction to 8x8.
        branch3 = conv(conv(x, 192, 1), 320, 3, stride=2, padding="VALID")
        branch7x3 = conv(conv(conv(conv(x, 192, 1), 192, (1, 7)), 192, (7, 1)), 192, 3, 2, "VALID")
        x = jnp.concatenate([branch3, branch7x3, max_pool(x)], axis=-1)
        # Two 8x8 blocks with expanded filter banks.
        for _ in range(2):
            branch1 = conv(x, 320, 1)
            branch3 = conv(x, 384, 1)
            branch3 = jnp.concatenate([conv(branch3, 384, (1, 3)), conv(branch3, 384, (3, 1))], -1)
            branch3dbl = conv(conv(x, 448, 1), 384, 3)
            branch3dbl = jnp.concatenate(
                [conv(branch3dbl, 384, (1, 3)), conv(branch3dbl, 384, (3, 1))], -1
            )
            pooled = conv(avg_pool(x), 192, 1)
            x = jnp.concatenate([branch1, branch3, branch3dbl, pooled], axis=-1)
        x = jnp.mean(x, axis=(1, 2))
        return hk.Linear(num_classes)(x)

    return forward
