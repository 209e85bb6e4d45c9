"""Agreement between the processes of one `jax.distributed` job.

Every rank must run the same program: if one rank ran the rewritten module and
another the original, their collectives would not match and the job would hang.
So each decision is shared through the coordinator's key-value store, and every
read has a deadline: a rank that is gone or slow gives an error, never a hang.
In a single process these functions return at once.
"""

from __future__ import annotations

from jax._src import distributed

DEFAULT_TIMEOUT_S = 600.0


class AgreementError(RuntimeError):
    """The ranks disagree, or one did not answer in time."""


def _client():
    state = distributed.global_state
    if state.client is None or not state.num_processes or state.num_processes < 2:
        return None, 0, 1
    return state.client, state.process_id, state.num_processes


def process_count() -> int:
    return _client()[2]


def gather(topic: str, value: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> list[str]:
    """Every rank's `value` for `topic`, in rank order (each rank publishes its
    own and reads the others'). `topic` must be used once per job."""
    client, rank, count = _client()
    if client is None:
        return [value]
    client.key_value_set(f"disco_xla/{topic}/{rank}", value)
    values = []
    for other in range(count):
        try:
            values.append(
                client.blocking_key_value_get(f"disco_xla/{topic}/{other}", int(timeout_s * 1000))
            )
        except Exception as error:  # noqa: BLE001 - XLA raises its own status errors
            raise AgreementError(
                f"rank {other} did not answer {topic!r} within {timeout_s:.0f} s "
                f"({' '.join(str(error).split())[:200]})"
            ) from None
    return values


def broadcast(topic: str, make_value, timeout_s: float = DEFAULT_TIMEOUT_S) -> str:
    """Rank 0 computes `make_value()` and every rank gets its result. If rank 0
    fails, it publishes the failure, so the others raise instead of waiting."""
    client, rank, _ = _client()
    if client is None:
        return make_value()
    key = f"disco_xla/{topic}/from_rank_0"
    if rank == 0:
        try:
            value = make_value()
        except Exception as error:
            client.key_value_set(key, "error:" + " ".join(str(error).split())[:500])
            raise
        client.key_value_set(key, "ok:" + value)
        return value
    try:
        answer = client.blocking_key_value_get(key, int(timeout_s * 1000))
    except Exception as error:  # noqa: BLE001
        raise AgreementError(
            f"rank 0 did not publish {topic!r} within {timeout_s:.0f} s "
            f"({' '.join(str(error).split())[:200]})"
        ) from None
    status, _, value = answer.partition(":")
    if status != "ok":
        raise AgreementError(f"rank 0 failed to decide {topic!r}: {value}")
    return value
