"""Convolutional networks in dm-haiku: ResNet-50, VGG-19 and Inception-v3.

`size="full"` is the published architecture for 224x224 (299x299 for Inception)
ImageNet inputs; `size="tiny"` keeps the topology with small widths and depths
for the tests. Each builder returns a function `(images, is_training) -> logits`
to be wrapped by `hk.transform_with_state` (batch norm keeps running statistics).
"""

from __future__ import annotations

from collections.abc import Callable

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


# conv(x, filters, kernel, stride=1, padding="SAME") -> ReLU(batch norm(Conv2D(x))):
# Inception-v3's unit, with its width already scaled to the model's size.
InceptionConvFn = Callable[..., jax.Array]


def inception_v3(size: str, num_classes: int):
    divisor = 1 if size == "full" else 8

    def forward(images, is_training):
        conv = _inception_conv(divisor, is_training)
        x = _inception_stem(images, conv)
        # Three 35x35 blocks (the pool branch widens from 32 to 64).
        for pool_filters in (32, 64, 64):
            x = _inception_35x35_block(x, conv, pool_filters)
        x = _inception_reduction_to_17x17(x, conv)
        # Four 17x17 blocks with factorised 7x7 convolutions.
        for middle in (128, 160, 160, 192):
            x = _inception_17x17_block(x, conv, middle)
        x = _inception_reduction_to_8x8(x, conv)
        # Two 8x8 blocks with expanded filter banks.
        for _ in range(2):
            x = _inception_8x8_block(x, conv)
        x = jnp.mean(x, axis=(1, 2))
        return hk.Linear(num_classes)(x)

    return forward


def _inception_conv(divisor: int, is_training) -> InceptionConvFn:
    """The convolution unit, with `filters // divisor` (at least 4) output
    channels, and its batch norm in training mode or not."""

    def conv(x, filters, kernel, stride=1, padding="SAME"):
        x = hk.Conv2D(
            max(filters // divisor, 4),
            kernel_shape=kernel,
            stride=stride,
            padding=padding,
            with_bias=False,
        )(x)
        x = hk.BatchNorm(create_scale=False, create_offset=True, decay_rate=0.99)(x, is_training)
        return jax.nn.relu(x)

    return conv


def _avg_pool_3x3(x):
    return hk.avg_pool(x, window_shape=(3, 3, 1), strides=(1, 1, 1), padding="SAME")


def _max_pool_3x3_stride_2(x):
    return hk.max_pool(x, window_shape=(3, 3, 1), strides=(2, 2, 1), padding="VALID")


def _inception_stem(images, conv: InceptionConvFn):
    """Five convolutions and two max-pools from the image to 35x35."""
    x = conv(images, 32, 3, stride=2, padding="VALID")
    x = conv(x, 32, 3, padding="VALID")
    x = conv(x, 64, 3)
    x = _max_pool_3x3_stride_2(x)
    x = conv(x, 80, 1, padding="VALID")
    x = conv(x, 192, 3, padding="VALID")
    return _max_pool_3x3_stride_2(x)


def _inception_35x35_block(x, conv: InceptionConvFn, pool_filters: int):
    """Branches 1x1, 5x5, double 3x3 and pooled 1x1, concatenated."""
    branch1 = conv(x, 64, 1)
    branch5 = conv(conv(x, 48, 1), 64, 5)
    branch3 = conv(conv(conv(x, 64, 1), 96, 3), 96, 3)
    pooled = conv(_avg_pool_3x3(x), pool_filters, 1)
    return jnp.concatenate([branch1, branch5, branch3, pooled], axis=-1)


def _inception_reduction_to_17x17(x, conv: InceptionConvFn):
    """Strided 3x3, strided double 3x3 and a max-pool, concatenated."""
    branch3 = conv(x, 384, 3, stride=2, padding="VALID")
    branch3dbl = conv(conv(conv(x, 64, 1), 96, 3), 96, 3, stride=2, padding="VALID")
    return jnp.concatenate([branch3, branch3dbl, _max_pool_3x3_stride_2(x)], axis=-1)


def _inception_17x17_block(x, conv: InceptionConvFn, middle: int):
    """Branches 1x1, 7x7 and double 7x7 (each 7x7 as 1x7 and 7x1 with `middle`
    channels), and pooled 1x1, concatenated."""
    branch1 = conv(x, 192, 1)
    branch7 = conv(conv(conv(x, middle, 1), middle, (1, 7)), 192, (7, 1))
    branch7dbl = conv(x, middle, 1)
    for filters, kernel in ((middle, (7, 1)), (middle, (1, 7)), (middle, (7, 1))):
        branch7dbl = conv(branch7dbl, filters, kernel)
    branch7dbl = conv(branch7dbl, 192, (1, 7))
    pooled = conv(_avg_pool_3x3(x), 192, 1)
    return jnp.concatenate([branch1, branch7, branch7dbl, pooled], axis=-1)


def _inception_reduction_to_8x8(x, conv: InceptionConvFn):
    """Strided 3x3, 7x7 then strided 3x3, and a max-pool, concatenated."""
    branch3 = conv(conv(x, 192, 1), 320, 3, stride=2, padding="VALID")
    branch7x3 = conv(conv(conv(conv(x, 192, 1), 192, (1, 7)), 192, (7, 1)), 192, 3, 2, "VALID")
    return jnp.concatenate([branch3, branch7x3, _max_pool_3x3_stride_2(x)], axis=-1)


def _inception_8x8_block(x, conv: InceptionConvFn):
    """Branches 1x1, 3x3 split into 1x3 and 3x1, double 3x3 split the same
    way, and pooled 1x1, concatenated."""
    branch1 = conv(x, 320, 1)
    branch3 = conv(x, 384, 1)
    branch3 = jnp.concatenate([conv(branch3, 384, (1, 3)), conv(branch3, 384, (3, 1))], -1)
    branch3dbl = conv(conv(x, 448, 1), 384, 3)
    branch3dbl = jnp.concatenate([conv(branch3dbl, 384, (1, 3)), conv(branch3dbl, 384, (3, 1))], -1)
    pooled = conv(_avg_pool_3x3(x), 192, 1)
    return jnp.concatenate([branch1, branch3, branch3dbl, pooled], axis=-1)
