"""The fault test's own checks on hand-made histories (no cluster needed):
the lost-write rule and the key choice.

    .venv/bin/python -m pytest -q tests/chaos
"""

import json

from chaos import REDIS_SLOTS, lost_writes, pick_keys, rows_out_of_bounds, slot_of


def history(tmp_path, *records):
    path = tmp_path / "h.jsonl"
    with open(path, "w") as f:
        for client, op, key, value, call, ret, known in records:
            f.write(json.dumps({"client": client, "op": op, "key": key, "value": value, "call": call,
                                "return": ret, "known": known, "via": "test"}) + "\n")
    return [path]


def test_a_key_read_as_absent_lost_every_acknowledged_write(tmp_path):
    files = history(tmp_path,
                    (0, "put", "k", "a", 0, 10, True),
                    (1, "put", "k", "b", 5, None, False),
                    (0, "put", "k", "c", 20, 30, True))
    lost, corrupt = lost_writes(files, {"k": [(100, None)]})
    assert sorted(v for _, v, _ in lost) == ["a", "c"] and corrupt == []


def test_a_write_begun_after_the_final_values_write_ended_is_lost(tmp_path):
    files = history(tmp_path,
                    (0, "put", "k", "old", 0, 10, True),
                    (1, "put", "k", "w", 20, 30, True),
                    (0, "put", "k", "overlapping", 25, 40, True),
                    (0, "put", "k", "after", 50, 60, True),
                    (0, "put", "k", "unknown", 70, None, False))
    lost, corrupt = lost_writes(files, {"k": [(90, "w"), (100, "w")]})
    # "old" came before w, "overlapping" may be ordered before it, and
    # "unknown" may never have happened: only "after" must have replaced w.
    assert [(k, v) for k, v, _ in lost] == [("k", "after")] and corrupt == []


def test_a_final_value_of_unknown_outcome_bounds_nothing(tmp_path):
    files = history(tmp_path,
                    (0, "put", "k", "w", 0, None, False),
                    (1, "put", "k", "later", 50, 60, True))
    assert lost_writes(files, {"k": [(100, "w")]}) == ([], [])


def test_a_final_value_nobody_wrote_is_corrupt(tmp_path):
    files = history(tmp_path, (0, "put", "k", "a", 0, 10, True))
    assert lost_writes(files, {"k": [(100, "zzz")]}) == ([], [("k", "zzz")])


def test_the_last_final_read_decides(tmp_path):
    files = history(tmp_path,
                    (0, "put", "k", "a", 0, 10, True),
                    (0, "put", "k", "b", 20, 30, True))
    # Two final reads: the later one (by completion time) is the final value.
    assert lost_writes(files, {"k": [(200, "b"), (100, "a")]}) == ([], [])
    lost, _ = lost_writes(files, {"k": [(100, "b"), (200, "a")]})
    assert [v for _, v, _ in lost] == ["b"]


def test_slots_are_redis_clusters():
    assert slot_of("foo") == 12182  # CLUSTER KEYSLOT foo
    assert slot_of("{user1000}.following") == slot_of("user1000")


def test_keys_spread_over_every_servers_slots():
    keys = pick_keys(16, 3)
    owners = [slot_of(k) * 3 // REDIS_SLOTS for k in keys]
    assert len(set(keys)) == 16 and sorted(owners.count(i) for i in range(3)) == [5, 5, 6]


def test_a_row_holds_its_acknowledged_pushes_and_at_most_the_unknown_ones():
    acked, unknown = [3, 3, 3, 3], [0, 2, 2, 0]
    # Exact, within the unknown ones, the initializer's start.
    assert rows_out_of_bounds([3.0, 4.0, 5.004, 2.995], acked, unknown) == []
    # A lost acknowledged push, a push applied twice, not a count at all.
    bad = rows_out_of_bounds([2.0, 6.0, 3.5, 3.0], acked, unknown)
    assert [r for r, *_ in bad] == [0, 1, 2]
