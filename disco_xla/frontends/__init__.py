"""Where users meet disco-xla, the top layer: `disco_xla.jit` (`jax_api`, its
trial `jax_trial`, the background search `jax_background`),
`disco_xla.tf_function` (`tf_api`, `tf_trial`), what both wrap a step in
(`wrapped_step`), and the `DISCO_XLA_FLAGS` hook for unmodified scripts
(`env_hook`). The CLI (`disco_xla.cli`) sits beside them."""
