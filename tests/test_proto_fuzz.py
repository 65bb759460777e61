"""Hypothesis-driven mutations of golden NetDefs, OperatorDefs and PlanDefs through the Rust
decoder (``_native.roundtrip``): every mutant gives bytes or ``DecodeError``, never a crash,
and what Rust accepts, Python accepts and reads the same way."""

import random
import re

import pytest
from golden_messages import samples
from google.protobuf.message import DecodeError as ProtobufDecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ferrocaffe import _native
from ferrocaffe.proto import caffe2_pb2

KINDS = ("NetDef", "OperatorDef", "PlanDef")
OVERLONG_KEY = re.compile(rb"[\x80-\xff]{5}")
FUZZ = settings(
    max_examples=400,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture(scope="module")
def seeds(golden_dir):
    picked = {s.data: s for s in samples(golden_dir) if s.kind in KINDS and 0 < len(s.data) <= 2048}
    return sorted(picked.values(), key=lambda s: s.data)


def _varint(v: int) -> bytes:
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _mutate(data: bytearray, op: int, a: int, b: int, blob: bytes, other: bytes) -> None:
    n = len(data)
    if op == 0 and n:
        data[a % n] ^= 1 << (b % 8)
    elif op == 1 and n:
        data[a % n] = b % 256
    elif op == 2:
        del data[a % (n + 1) :]
    elif op == 3:
        at = a % (n + 1)
        data[at:at] = blob or b"\x00"
    elif op == 4 and n:
        start = a % n
        del data[start : start + b % (n - start + 1)]
    elif op == 5 and n:
        start = a % n
        piece = data[start : start + b % 65]
        at = b % (n + 1)
        data[at:at] = piece
    elif op == 6:
        del data[a % (n + 1) :]
        data.extend(other[b % (len(other) + 1) :])
    else:  # corrupt the length after something that looks like a length-delimited tag
        spots = [i + 1 for i in range(n - 1) if data[i] & 7 == 2 and data[i] >> 3]
        if not spots:
            return
        at = spots[a % len(spots)]
        end = next((i + 1 for i in range(at, n) if data[i] < 0x80), n)
        choices = [b"\x00", _varint(data[at] & 0x7F) + b"", _varint((data[at] & 0x7F) + 1 + b % 4)]
        choices += [_varint(max(0, (data[at] & 0x7F) - 1 - b % 4)), _varint(2**32 - 1)]
        choices += [_varint(2**64 - 1), b"\xff" * 11]
        data[at:end] = choices[b % len(choices)]


mutation = st.tuples(
    st.integers(0, 7), st.integers(0, 2**32), st.integers(0, 2**32), st.binary(max_size=8)
)


def _python_parse(kind, data):
    try:
        return getattr(caffe2_pb2, kind).FromString(data)
    except ProtobufDecodeError:
        return None


def _check(kind: str, data: bytes) -> bool:
    """Returns whether Rust accepted ``data``; asserts everything that must then hold."""
    try:
        out = _native.roundtrip(kind, data)
    except _native.DecodeError as e:
        assert str(e).startswith(f"malformed caffe2.{kind} protobuf: ")
        return False
    assert isinstance(out, bytes)
    # Rust's output is canonical: valid for Python, and a fixed point of Rust's round trip.
    assert _python_parse(kind, out) is not None
    assert _native.roundtrip(kind, out) == out
    # What Rust accepts, Python accepts, and after Python's own round trip (which keeps
    # unknown fields; partial: a proto2 `required` field may be missing) Rust reads the same.
    in_python = _python_parse(kind, data)
    if in_python is None:
        # The one known exception (README, "Wire format"): a field key written in more than
        # five bytes, which prost reads and protobuf refuses. Such a key needs at least five
        # bytes in a row with the continuation bit set.
        assert OVERLONG_KEY.search(data), f"Python rejects what Rust accepts: {data!r}"
        return True
    assert _native.roundtrip(kind, in_python.SerializePartialToString()) == out
    return True


@FUZZ
@given(data=st.data())
def test_mutated_golden_messages(seeds, data):
    # Indices, not samples: keeps Hypothesis's report of a failure short.
    seed = seeds[data.draw(st.integers(0, len(seeds) - 1), label="seed")]
    other = seeds[data.draw(st.integers(0, len(seeds) - 1), label="other")].data
    mutant = bytearray(seed.data)
    for op in data.draw(st.lists(mutation, min_size=1, max_size=4), label="mutations"):
        _mutate(mutant, *op, other)
    for kind in KINDS:
        _check(kind, bytes(mutant))


@FUZZ
@given(blob=st.binary(max_size=128), kind=st.sampled_from(KINDS))
def test_random_bytes(blob, kind):
    _check(kind, blob)


def test_mutations_reach_both_outcomes(seeds):
    # A fixed sweep: the mutations above must produce plenty of both outcomes.
    rng = random.Random(1234)
    accepted = rejected = 0
    for _ in range(3000):
        mutant = bytearray(rng.choice(seeds).data)
        other = rng.choice(seeds).data
        for _ in range(rng.randint(1, 3)):
            _mutate(
                mutant,
                rng.randrange(8),
                rng.getrandbits(32),
                rng.getrandbits(32),
                rng.randbytes(rng.randrange(9)),
                other,
            )
        for kind in KINDS:
            if _check(kind, bytes(mutant)):
                accepted += 1
            else:
                rejected += 1
    assert accepted > 200 and rejected > 200, (accepted, rejected)
