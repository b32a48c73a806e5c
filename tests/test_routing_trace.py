"""RoutingTrace: construction, every bad input of issue 2 item 3, and the .npz round trip."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pytest

from moespec.routing import RoutingTrace


def _random_docs(rng, lengths, L=3, m=2, N=8):
    return [np.stack([np.stack([rng.choice(N, m, replace=False) for _ in range(L)]) for _ in range(T)])
            for T in lengths]


@pytest.fixture
def trace():
    rng = np.random.default_rng(1)
    return RoutingTrace(_random_docs(rng, [5, 1, 7]), 8, expert_bytes=[1.0, 2.5, 3.0],
                        doc_ids=["a", "b", "c"], model="tiny", source="unit test", meta={"seed": 1})


def test_shape_properties(trace):
    assert (trace.num_docs, trace.num_layers, trace.top_k, trace.num_experts) == (3, 3, 2, 8)
    assert trace.num_tokens == 13
    assert trace.doc_lengths.tolist() == [5, 1, 7]
    assert trace.label == "unit test"
    assert trace.docs[0].dtype == np.uint8


def test_default_bytes_and_ids():
    tr = RoutingTrace([np.array([[[0, 1]], [[1, 2]]])], 3)
    assert tr.expert_bytes.tolist() == [1.0]
    assert tr.doc_ids == ["0"]
    assert tr.label == "trace"


def test_round_trip(trace, tmp_path):
    path = trace.save(tmp_path / "t.npz")
    back = RoutingTrace.load(path)
    assert back.num_experts == 8 and back.doc_ids == ["a", "b", "c"]
    assert back.model == "tiny" and back.source == "unit test" and back.meta == {"seed": 1}
    assert back.expert_bytes.tolist() == [1.0, 2.5, 3.0]
    assert all(np.array_equal(a, b) for a, b in zip(trace.docs, back.docs))
    # no pickle anywhere: every stored array loads with allow_pickle=False
    with np.load(path, allow_pickle=False) as npz:
        assert sorted(npz.files) == ["expert_bytes", "ids", "meta", "offsets"]


def test_save_keeps_other_suffix(trace, tmp_path):
    path = trace.save(tmp_path / "t.trace")
    assert path.exists() and not (tmp_path / "t.trace.npz").exists()
    assert RoutingTrace.load(path).num_tokens == 13


def test_subset_and_concat(trace):
    sub = trace.subset([2, 0])
    assert sub.doc_ids == ["c", "a"] and np.array_equal(sub.docs[0], trace.docs[2])
    both = RoutingTrace.concat([trace.subset([0]), trace.subset([1, 2])])
    assert both.doc_ids == trace.doc_ids and both.num_tokens == trace.num_tokens
    with pytest.raises(ValueError, match="outside"):
        trace.subset([3])
    with pytest.raises(ValueError, match="unique"):
        trace.subset([0, 0])


GOOD = np.array([[[0, 1], [2, 3]], [[1, 2], [3, 0]]])  # T=2, L=2, m=2


@pytest.mark.parametrize("docs, N, match", [
    ([np.array([[[0, 4]]])], 4, r"document 0: expert id 4 at token 0, layer 0, slot 1 is outside \[0, N\) with N = 4"),
    ([GOOD, np.array([[[0, -1], [1, 2]]])], 4, r"document 1: expert id -1 .*outside"),
    ([np.array([[[1, 1]]])], 4, r"document 0: token 0, layer 0 selects the same expert twice: \[1, 1\]"),
    ([GOOD, GOOD[:, :1]], 4, r"document 1: ragged trace: expected \(L, m\) = \(2, 2\).*found \(L, m\) = \(1, 2\)"),
    ([GOOD, GOOD[:, :, :1]], 4, r"document 1: ragged trace.*found \(L, m\) = \(2, 1\)"),
    ([GOOD, GOOD[:0]], 4, r"document 1: empty document"),
    ([GOOD.astype(float)], 4, r"document 0: expert ids must be integers, found dtype float64"),
    ([GOOD.astype(bool)], 4, r"must be integers, found dtype bool"),
    ([GOOD[0]], 4, r"expected an array \[T, L, m\].*found 2 dimension"),
    ([], 4, r"at least one document"),
    ([GOOD], 1.5, r"num_experts must be an integer"),
    ([np.array([[[0, 1, 2]]])], 2, r"m = 3 slots exceed N = 2"),
])
def test_bad_input(docs, N, match):
    with pytest.raises(ValueError, match=match):
        RoutingTrace(docs, N)


def test_bad_metadata():
    with pytest.raises(ValueError, match=r"expert_bytes: expected shape \(2,\)"):
        RoutingTrace([GOOD], 4, expert_bytes=[1.0])
    with pytest.raises(ValueError, match=r"expert_bytes: every w_l must be finite and > 0"):
        RoutingTrace([GOOD], 4, expert_bytes=[1.0, 0.0])
    with pytest.raises(ValueError, match=r"doc_ids: expected 1 ids"):
        RoutingTrace([GOOD], 4, doc_ids=["a", "b"])
    with pytest.raises(ValueError, match="unique"):
        RoutingTrace([GOOD, GOOD], 4, doc_ids=["a", "a"])


def test_doc_ids_must_be_a_sequence_of_ids():
    """A bare string is not three ids; each id is a string or an integer (kept as a string)."""
    with pytest.raises(ValueError, match=r"doc_ids: expected a sequence .* found str 'abc'"):
        RoutingTrace([GOOD, GOOD, GOOD], 4, doc_ids="abc")
    with pytest.raises(ValueError, match=r"doc_ids\[1\]: an id must be a string or an integer; found float 1.5"):
        RoutingTrace([GOOD, GOOD], 4, doc_ids=[0, 1.5])
    with pytest.raises(ValueError, match=r"doc_ids\[0\]: an id must be a string or an integer; found NoneType"):
        RoutingTrace([GOOD], 4, doc_ids=[None])
    with pytest.raises(ValueError, match=r"doc_ids: expected a sequence"):
        RoutingTrace([GOOD, GOOD], 4, doc_ids={"a", "b"})    # a set has no order
    assert RoutingTrace([GOOD, GOOD], 4, doc_ids=[7, np.int64(9)]).doc_ids == ["7", "9"]
    assert RoutingTrace([GOOD, GOOD], 4, doc_ids=np.array(["x", "y"])).doc_ids == ["x", "y"]


def test_truncated_file(trace, tmp_path):
    path = trace.save(tmp_path / "t.npz")
    data = path.read_bytes()
    bad = tmp_path / "cut.npz"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"cut\.npz: truncated or corrupt"):
        RoutingTrace.load(bad)


def test_corrupt_file(trace, tmp_path):
    path = trace.save(tmp_path / "t.npz")
    data = bytearray(path.read_bytes())
    # flip bytes inside the first member's compressed payload: CRC or zlib error on read
    for i in range(60, 90):
        data[i] ^= 0xFF
    bad = tmp_path / "flip.npz"
    bad.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"flip\.npz: "):
        RoutingTrace.load(bad)
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not a zip file at all")
    with pytest.raises(ValueError, match=r"junk\.npz: truncated or corrupt"):
        RoutingTrace.load(junk)


def _rewrite(src, dst, drop=None, **replace):
    with np.load(src, allow_pickle=False) as npz:
        fields = {k: npz[k] for k in npz.files if k != drop}
    fields.update(replace)
    np.savez_compressed(dst, **fields)
    return dst


@pytest.mark.parametrize("field", ["ids", "offsets", "expert_bytes", "meta"])
def test_missing_field(trace, tmp_path, field):
    path = _rewrite(trace.save(tmp_path / "t.npz"), tmp_path / "m.npz", drop=field)
    with pytest.raises(ValueError, match=rf"m\.npz: missing field\(s\) \['{field}'\]"):
        RoutingTrace.load(path)


def test_invalid_contents_name_the_file(trace, tmp_path):
    src = trace.save(tmp_path / "t.npz")
    with np.load(src) as npz:
        ids, meta = npz["ids"].astype(np.int64), json.loads(str(npz["meta"][0]))
    ids[3, 1, 0] = 99
    with pytest.raises(ValueError, match=r"bad_ids\.npz: document 0: expert id 99 at token 3, layer 1"):
        RoutingTrace.load(_rewrite(src, tmp_path / "bad_ids.npz", ids=ids))
    with pytest.raises(ValueError, match=r"floats\.npz: document 0: expert ids must be integers"):
        RoutingTrace.load(_rewrite(src, tmp_path / "floats.npz", ids=ids.astype(float) * 0))
    with pytest.raises(ValueError, match=r"offsets\.npz: field 'offsets' must rise"):
        RoutingTrace.load(_rewrite(src, tmp_path / "offsets.npz", offsets=np.array([0, 5, 99])))
    with pytest.raises(ValueError, match=r"empty\.npz: document 1: empty document"):
        RoutingTrace.load(_rewrite(src, tmp_path / "empty.npz", offsets=np.array([0, 5, 5, 13])))
    del meta["num_experts"]
    with pytest.raises(ValueError, match=r"nometa\.npz: field 'meta' lacks 'num_experts'"):
        RoutingTrace.load(_rewrite(src, tmp_path / "nometa.npz", meta=np.array([json.dumps(meta)])))
    with pytest.raises(ValueError, match=r"pickled\.npz: unreadable"):
        RoutingTrace.load(_rewrite(src, tmp_path / "pickled.npz", meta=np.array([{"a": 1}], dtype=object)))
    with pytest.raises(ValueError, match=r"notjson\.npz: field 'meta' is not valid JSON"):
        RoutingTrace.load(_rewrite(src, tmp_path / "notjson.npz", meta=np.array(["{oops"])))


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such routing trace"):
        RoutingTrace.load(tmp_path / "nope.npz")


def test_zip_is_plain_npz(trace, tmp_path):
    path = trace.save(tmp_path / "t.npz")
    with zipfile.ZipFile(path) as zf:
        assert sorted(zf.namelist()) == ["expert_bytes.npy", "ids.npy", "meta.npy", "offsets.npy"]
