"""The client side of acks per range (SettleBatch.range_args): every lease of a batch
travels in exactly one element, and the element order the results follow is the one
the server numbers them in (functions/ack_ranges.sql expands each element's bits). A
batch of leases the backend issued (vouched for: no checks, grouped by token) travels
exactly as the same batch checked lease by lease."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from rheo_flow._backends._issued import Issued
from rheo_flow._backends.postgres._batch import SettleBatch
from rheo_flow._model._event import make_event_json
from rheo_flow._model._lease import Lease, make_lease

GROUPS = {("s", "g"): (7, 3)}


def _lease(part: int, token: str, base: int, offset: int, attempt: int) -> Lease:
    seq = base + offset
    event = make_event_json("s", part, seq, f"e{part}-{seq}", "t", "{}", None, {}, 0)
    return make_lease(f"{token}{offset:08x}", f"{part}-{seq}-{attempt}", "g", "c", event,
                      attempt, 0)


ranges = st.lists(
    st.tuples(st.integers(0, 2), st.integers(1, 50), st.integers(1, 3),
              st.sets(st.integers(0, 40), min_size=1, max_size=12)),
    min_size=1, max_size=5)


def _split(text: str) -> list[str]:
    return text[1:-1].split(",")


@settings(max_examples=200, deadline=None)
@given(ranges, st.randoms(use_true_random=False))
def test_each_lease_travels_once_in_the_order_results_follow(
        spec: list[tuple[int, int, int, set[int]]], rnd: random.Random) -> None:
    leases = [_lease(part, f"{n:024x}", base * 100, offset, attempt)
              for n, (part, base, attempt, offsets) in enumerate(spec)
              for offset in sorted(offsets)]
    rnd.shuffle(leases)
    batch = SettleBatch(leases, GROUPS)
    issued = Issued()
    issued.register(leases)
    unchecked = SettleBatch(leases, GROUPS, issued)
    assert len(issued) == 0, "the batch's leases are forgotten"
    assert unchecked.range_args() == batch.range_args()
    assert unchecked.order == batch.order
    parts, tokens, atts, bases, los, bits, counts = map(_split, batch.range_args())
    # Expand every element as the server does: a lease per bit set, numbered in turn.
    expanded = []
    for part, token, att, base, lo, mask, count in zip(parts, tokens, atts, bases, los, bits,
                                                        counts, strict=True):
        seqs = [int(lo) + k for k, bit in enumerate(mask) if bit == "1"]
        assert len(seqs) == int(count)
        expanded += [(int(part), seq, f"{token}{seq - int(base):08x}", int(att))
                     for seq in seqs]
    assert len(batch.order) == len(leases)
    assert sorted(batch.order) == list(range(len(leases)))
    assert expanded == [(leases[i].partition, leases[i].sequence, leases[i].lease_id,
                         leases[i].attempt) for i in batch.order]
    # One element per range, in (partition, lowest sequence) order (the lock order).
    assert len(parts) == len(spec)
    keys = [(int(p), int(lo)) for p, lo in zip(parts, los, strict=True)]
    assert keys == sorted(keys)
