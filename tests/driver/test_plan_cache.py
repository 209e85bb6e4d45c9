"""The sqlite plan cache: keys, hits, concurrent writers, damaged files."""

from __future__ import annotations

import dataclasses
import multiprocessing

import pytest

from disco_xla.driver.plan_cache import PlanCache, cache_key
from disco_xla.plan import Plan
from disco_xla.simulator.profiles import load_profile


def _plan(index: int) -> Plan:
    return Plan(f"module{index}", f"{index:064x}", ((f"a{index}",),), ((f"r{index}",),))


def test_a_stored_plan_comes_back_and_other_keys_miss(tmp_path):
    cache = PlanCache(tmp_path)
    key = cache_key("f" * 64, load_profile("cpu-local"), {"seed": 0})
    assert cache.get(key) is None
    assert cache.put(key, _plan(1))
    assert cache.get(key) == _plan(1)
    assert len(cache) == 1


def test_the_key_changes_with_the_module_the_profile_and_the_options():
    cpu, v100 = load_profile("cpu-local"), load_profile("v100-2x8-25g")
    base = cache_key("a" * 64, cpu, {"seed": 0, "alpha": 1.05})
    assert base == cache_key("a" * 64, cpu, {"alpha": 1.05, "seed": 0})
    assert base != cache_key("b" * 64, cpu, {"seed": 0, "alpha": 1.05})
    assert base != cache_key("a" * 64, v100, {"seed": 0, "alpha": 1.05})
    assert base != cache_key("a" * 64, cpu, {"seed": 1, "alpha": 1.05})


def _writer(directory: str, first: int, count: int, start) -> None:
    start.wait()  # all writers open the new file at once: the race that creating it must survive
    cache = PlanCache(directory)
    for index in range(first, first + count):
        assert cache.put(f"key{index}", _plan(index))
        assert cache.get(f"key{index - 1}") in (None, _plan(index - 1))


def test_concurrent_processes_write_without_losing_plans(tmp_path):
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(8)
    writers = [
        context.Process(target=_writer, args=(str(tmp_path), 100 * n, 25, start)) for n in range(8)
    ]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(timeout=120)
        assert writer.exitcode == 0
    cache = PlanCache(tmp_path)
    assert len(cache) == 200
    assert all(cache.get(f"key{100 * n + 24}") == _plan(100 * n + 24) for n in range(8))


@pytest.mark.parametrize("content", [b"", b"not a database at all" * 100])
def test_a_damaged_cache_file_is_a_miss_not_an_error(tmp_path, content):
    (tmp_path / "plans.sqlite").write_bytes(content)
    cache = PlanCache(tmp_path)
    if content:
        assert cache.get("key") is None
        assert not cache.put("key", _plan(1))
    else:  # an empty file is a valid empty database
        assert cache.get("key") is None
        assert cache.put("key", _plan(1))


def test_candidates_and_their_measured_choice_round_trip(tmp_path):
    from disco_xla.driver.plan_cache import CandidateRecord

    cache = PlanCache(tmp_path)
    key = cache_key("c" * 64, load_profile("cpu-local"), {"seed": 0})
    assert cache.get_candidates(key) is None
    record = CandidateRecord(
        {"plan": _plan(1), "candidate-2": _plan(2), "baseline:ddp": _plan(3)},
        {"plan": 0.001, "candidate-2": 0.0011, "baseline:ddp": 0.0012},
    )
    assert cache.put_candidates(key, record)
    assert cache.get_candidates(key) == record and record.chosen is None
    measured = CandidateRecord(
        record.plans, record.simulated_s, "candidate-2", {"original": 0.002, "candidate-2": 0.0015}
    )
    assert cache.put_candidates(key, measured)  # the measured choice replaces the unmeasured
    assert PlanCache(tmp_path).get_candidates(key) == measured


def test_a_damaged_candidates_entry_is_a_miss(tmp_path):
    import sqlite3

    from disco_xla.driver.plan_cache import CandidateRecord

    cache = PlanCache(tmp_path)
    assert cache.put_candidates("key", CandidateRecord({"plan": _plan(1)}))
    connection = sqlite3.connect(tmp_path / "plans.sqlite")
    with connection:
        connection.execute("UPDATE candidates SET record = '{\"plans\": 3'")
    connection.close()
    assert cache.get_candidates("key") is None


def test_step_times_round_trip_and_each_module_keeps_its_first_measured_run(tmp_path):
    """A measured first call's step times come back by machine and device
    count, without the collective and tuple tensor costs its simulation
    included; a module measured again keeps the first run's."""
    from disco_xla.driver.plan_cache import CandidateRecord

    plans = {"plan": _plan(1), "candidate-2": Plan("module1", f"{1:064x}", (), (("r1",),))}
    record = CandidateRecord(
        plans,
        {"plan": 0.004, "candidate-2": 0.010},
        "plan",
        {"plan": 0.005, "candidate-2": 0.020, "original": 0.006},
        messages={"plan": 2, "candidate-2": 10},
        message_s=0.0005,
        workers=4,
        tuple_tensors={"plan": 4},
        tuple_element_s=0.0001,
    )
    again = CandidateRecord.from_json(record.to_json(), "test")
    assert again == record
    times = record.step_times()  # 'original' has no plan: not kept
    assert sorted((t.messages, t.tuple_tensors, t.simulated_s, t.measured_s) for t in times) == [
        (2, 4, pytest.approx(0.0026), 0.005),
        (10, 0, pytest.approx(0.005), 0.020),
    ]
    cache = PlanCache(tmp_path)
    assert cache.add_step_times("machine", 4, times)
    assert sorted(cache.step_times("machine", 4)) == sorted(times)
    assert cache.step_times("machine", 8) == [] and cache.step_times("other", 4) == []
    remeasured = [dataclasses.replace(t, measured_s=1.0) for t in times]
    assert not cache.add_step_times("machine", 4, remeasured)
    assert sorted(cache.step_times("machine", 4)) == sorted(times)


def test_step_times_kept_before_tuple_tensors_were_counted_are_dropped(tmp_path):
    """A cache whose step_times table predates the tuple tensor count (its
    `messages` counted each tuple tensor) is emptied of them, not misread."""
    import sqlite3

    from disco_xla.simulator.step_time_fit import StepTime

    connection = sqlite3.connect(tmp_path / "plans.sqlite")
    with connection:
        connection.execute(
            "CREATE TABLE step_times (machine TEXT NOT NULL, workers INTEGER NOT NULL, "
            "module TEXT NOT NULL, program TEXT NOT NULL, messages INTEGER NOT NULL, "
            "simulated_s REAL NOT NULL, measured_s REAL NOT NULL, "
            "PRIMARY KEY (machine, workers, module, program))"
        )
        connection.execute("INSERT INTO step_times VALUES ('m', 4, 'a', 'p', 40, 0.01, 0.02)")
    connection.close()
    cache = PlanCache(tmp_path)
    assert cache.step_times("m", 4) == []
    kept = [StepTime("a", "p", 2, 0.01, 0.02, 39)]
    assert cache.add_step_times("m", 4, kept)
    assert cache.step_times("m", 4) == kept
