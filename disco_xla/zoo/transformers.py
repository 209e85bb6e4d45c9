"""Transformer models in dm-haiku: BERT, the encoder-decoder Transformer, GPT-2.

Each builder returns `(config, forward)`. `forward(batch) -> loss` is to be
wrapped by `hk.transform`; dropout is left out so the step is deterministic.

- BERT (Devlin et al. 2019): learned position and segment embeddings, post-LN
  encoder layers, a pooler, and the pre-training heads (masked-LM head whose
  decoder is tied to the word embeddings, next-sentence head).
- Transformer-base (Vaswani et al. 2017): 6+6 post-LN layers, sinusoidal
  positions, one 37,000-token vocabulary shared by source, target and the
  pre-softmax projection.
- GPT-2 small (Radford et al. 2019): pre-LN decoder with learned positions and
  the output projection tied to the token embeddings.
"""

from __future__ import annotations

from dataclasses import dataclass

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np


@dataclass(frozen=True)
class TransformerConfig:
    vocab: int
    hidden: int
    layers: int
    heads: int
    feedforward: int
    max_positions: int
    sequence: int  # the sequence length of the synthetic training batch


BERT_BASE = TransformerConfig(30522, 768, 12, 12, 3072, 512, 128)
BERT_LARGE = TransformerConfig(30522, 1024, 24, 16, 4096, 512, 128)
BERT_BASE_TINY = TransformerConfig(128, 32, 2, 2, 64, 32, 16)
BERT_LARGE_TINY = TransformerConfig(128, 48, 4, 3, 96, 32, 16)
TRANSFORMER_BASE = TransformerConfig(37000, 512, 6, 8, 2048, 0, 128)
TRANSFORMER_TINY = TransformerConfig(128, 32, 2, 2, 64, 0, 16)
GPT2_SMALL = TransformerConfig(50257, 768, 12, 12, 3072, 1024, 128)
GPT2_TINY = TransformerConfig(128, 32, 2, 2, 64, 32, 16)


def _layer_norm(name: str | None = None) -> hk.LayerNorm:
    return hk.LayerNorm(axis=-1, create_scale=True, create_offset=True, eps=1e-5, name=name)


def _attention(config: TransformerConfig, name: str) -> hk.MultiHeadAttention:
    return hk.MultiHeadAttention(
        num_heads=config.heads,
        key_size=config.hidden // config.heads,
        w_init=hk.initializers.VarianceScaling(1.0),
        name=name,
    )


def _feedforward(x, config: TransformerConfig, name: str):
    x = hk.Linear(config.feedforward, name=f"{name}_in")(x)
    return hk.Linear(config.hidden, name=f"{name}_out")(jax.nn.gelu(x))


def _post_ln_encoder_layer(x, mask, config: TransformerConfig, index: int):
    attended = _attention(config, f"layer_{index}_attention")(x, x, x, mask=mask)
    x = _layer_norm(f"layer_{index}_attention_norm")(x + attended)
    return _layer_norm(f"layer_{index}_output_norm")(
        x + _feedforward(x, config, f"layer_{index}_ffn")
    )


def _tied_logits(embed: hk.Embed, x):
    """The output projection that shares the embedding matrix."""
    return x @ embed.embeddings.T


def _cross_entropy(logits, labels):
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32))
    return -jnp.mean(jnp.take_along_axis(log_probs, labels[..., None], axis=-1))


def bert(config: TransformerConfig):
    """BERT pre-training: masked-LM loss over every position plus next-sentence loss."""

    def forward(batch):
        tokens, segments, mlm_labels, nsp_labels = batch
        words = hk.Embed(config.vocab, config.hidden, name="word_embeddings")
        positions = hk.get_parameter(
            "position_embeddings",
            [config.max_positions, config.hidden],
            init=hk.initializers.TruncatedNormal(0.02),
        )
        segment_table = hk.Embed(2, config.hidden, name="segment_embeddings")
        x = words(tokens) + positions[: tokens.shape[1]] + segment_table(segments)
        x = _layer_norm("embedding_norm")(x)
        for index in range(config.layers):
            x = _post_ln_encoder_layer(x, None, config, index)
        pooled = jnp.tanh(hk.Linear(config.hidden, name="pooler")(x[:, 0]))
        nsp_logits = hk.Linear(2, name="next_sentence")(pooled)
        transformed = jax.nn.gelu(hk.Linear(config.hidden, name="mlm_transform")(x))
        transformed = _layer_norm("mlm_norm")(transformed)
        mlm_bias = hk.get_parameter("mlm_output_bias", [config.vocab], init=jnp.zeros)
        mlm_logits = _tied_logits(words, transformed) + mlm_bias
        return _cross_entropy(mlm_logits, mlm_labels) + _cross_entropy(nsp_logits, nsp_labels)

    return forward


def bert_batch(config: TransformerConfig, batch: int, rng: np.random.Generator):
    shape = (batch, config.sequence)
    return (
        rng.integers(0, config.vocab, shape, dtype=np.int32),
        rng.integers(0, 2, shape, dtype=np.int32),
        rng.integers(0, config.vocab, shape, dtype=np.int32),
        rng.integers(0, 2, (batch,), dtype=np.int32),
    )


def _sinusoids(length: int, width: int) -> jnp.ndarray:
    position = np.arange(length)[:, None]
    rates = np.exp(-np.log(10000.0) * (np.arange(0, width, 2) / width))
    table = np.zeros((length, width), np.float32)
    table[:, 0::2] = np.sin(position * rates)
    table[:, 1::2] = np.cos(position * rates)
    return jnp.asarray(table)


def transformer(config: TransformerConfig):
    """Encoder-decoder translation loss with teacher forcing."""

    def forward(batch):
        source, target_in, target_out = batch
        embed = hk.Embed(config.vocab, config.hidden, name="shared_embeddings")
        scale = np.sqrt(config.hidden).astype(np.float32)
        x = embed(source) * scale + _sinusoids(source.shape[1], config.hidden)
        for index in range(config.layers):
            x = _post_ln_encoder_layer(x, None, config, index)
        memory = x
        length = target_in.shape[1]
        causal = jnp.tril(jnp.ones((1, 1, length, length), bool))
        y = embed(target_in) * scale + _sinusoids(length, config.hidden)
        for index in range(config.layers):
            attended = _attention(config, f"decoder_{index}_self_attention")(y, y, y, mask=causal)
            y = _layer_norm(f"decoder_{index}_self_norm")(y + attended)
            crossed = _attention(config, f"decoder_{index}_cross_attention")(y, memory, memory)
            y = _layer_norm(f"decoder_{index}_cross_norm")(y + crossed)
            y = _layer_norm(f"decoder_{index}_output_norm")(
                y + _feedforward(y, config, f"decoder_{index}_ffn")
            )
        return _cross_entropy(_tied_logits(embed, y), target_out)

    return forward


def transformer_batch(config: TransformerConfig, batch: int, rng: np.random.Generator):
    shape = (batch, config.sequence)
    return tuple(rng.integers(0, config.vocab, shape, dtype=np.int32) for _ in range(3))


def gpt2(config: TransformerConfig):
    """Next-token language-model loss."""

    def forward(batch):
        tokens, targets = batch
        embed = hk.Embed(config.vocab, config.hidden, name="token_embeddings")
        positions = hk.get_parameter(
            "position_embeddings",
            [config.max_positions, config.hidden],
            init=hk.initializers.TruncatedNormal(0.01),
        )
        length = tokens.shape[1]
        causal = jnp.tril(jnp.ones((1, 1, length, length), bool))
        x = embed(tokens) + positions[:length]
        for index in range(config.layers):
            normed = _layer_norm(f"block_{index}_attention_norm")(x)
            x = x + _attention(config, f"block_{index}_attention")(
                normed, normed, normed, mask=causal
            )
            x = x + _feedforward(
                _layer_norm(f"block_{index}_ffn_norm")(x), config, f"block_{index}_ffn"
            )
        x = _layer_norm("final_norm")(x)
        return _cross_entropy(_tied_logits(embed, x), targets)

    return forward


def gpt2_batch(config: TransformerConfig, batch: int, rng: np.random.Generator):
    shape = (batch, config.sequence)
    return tuple(rng.integers(0, config.vocab, shape, dtype=np.int32) for _ in range(2))
