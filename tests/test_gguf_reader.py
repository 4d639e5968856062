"""luce's bounded GGUF reader against gguf-py (the oracle for valid files) and against the
crafted files of tests/fixtures/crafted_gguf.py (each must be refused with exit code 2)."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFReader, GGUFWriter
from gguf.constants import GGMLQuantizationType, GGUFValueType

from fixtures.crafted_gguf import CRAFTED, CRAFTED_QWEN35, write_valid_qwen35, write_valid_small
from luce.converters.gguf_reader import GGUFFile, GGUFFormatError
from luce.errors import LuceError

# What each crafted file must be refused for (a fragment of the one-line message).
REASON = {
    "bad_magic": "bad magic", "bad_version": "unsupported GGUF version 7",
    "version_1": "unsupported GGUF version 1", "empty_file": "empty file",
    "string_array_holding_ints": "truncated", "nested_array": "nested arrays",
    "unknown_value_type": "unknown value type 99", "unknown_array_element_type": "unknown value type 77",
    "huge_string_length": "truncated", "string_length_past_eof": "truncated",
    "array_count_runs_to_eof": "truncated", "absurd_tensor_count": "tensor count",
    "absurd_kv_count": "KV count", "tensor_size_overflow": "overflows",
    "offset_plus_size_overflow": "past the end", "offset_past_eof": "past the end",
    "misaligned_offset": "not aligned", "overlapping_tensors": "overlap",
    "n_dims_over_4": "n_dims 5", "zero_dim": "zero dimension", "unknown_ggml_type": "unknown ggml type 4",
    "ne0_not_multiple_of_block": "block size", "alignment_not_power_of_two": "power of two",
    "duplicate_key": "duplicate key", "duplicate_tensor": "duplicate tensor",
    "truncated_header": "truncated", "truncated_kv": "bytes are left",
    "truncated_tensor_table": "truncated", "truncated_data": "past the end",
}


def test_every_crafted_case_has_a_reason():
    assert set(REASON) == set(CRAFTED)


@pytest.mark.parametrize("name", sorted(CRAFTED))
def test_crafted_file_is_refused_with_one_line(tmp_path, name):
    path = CRAFTED[name](tmp_path / f"{name}.gguf")
    with pytest.raises(GGUFFormatError) as err:
        GGUFFile.open(path)
    assert err.value.exit_code == 2
    message = str(err.value)
    assert "\n" not in message and str(path) in message
    assert REASON[name] in message


@pytest.mark.parametrize("name", sorted(CRAFTED_QWEN35))
def test_semantically_broken_qwen35_files_are_still_well_formed_containers(tmp_path, name):
    # These are for inspect / the native loader to refuse; the container itself is fine.
    with GGUFFile.open(CRAFTED_QWEN35[name](tmp_path / "t.gguf")) as gf:
        assert gf.arch == "qwen35"


def _assert_same_as_gguf_py(path):
    ref = GGUFReader(path)
    with GGUFFile.open(path) as gf:
        ref_keys = [f.name for f in ref.fields.values() if not f.name.startswith("GGUF.")]
        assert list(gf.kv) == ref_keys
        for key in ref_keys:
            expected = ref.fields[key].contents()
            got = gf.kv[key]
            if isinstance(got, np.ndarray):
                np.testing.assert_array_equal(got, np.asarray(expected))
            elif isinstance(got, float):
                assert got == pytest.approx(expected, rel=1e-7)
            else:
                assert got == expected, key
        assert list(gf.tensors) == [t.name for t in ref.tensors]
        for t in ref.tensors:
            info = gf.tensors[t.name]
            assert info.shape == tuple(int(x) for x in t.shape)
            assert info.ggml_type == t.tensor_type
            assert info.offset == t.data_offset and info.nbytes == t.n_bytes
            np.testing.assert_array_equal(gf.tensor_bytes(t.name), np.asarray(t.data).view(np.uint8).ravel())


def test_hand_built_qwen35_matches_gguf_py(tmp_path):
    _assert_same_as_gguf_py(write_valid_qwen35(tmp_path / "q.gguf"))


def test_hand_built_small_file_matches_gguf_py(tmp_path):
    _assert_same_as_gguf_py(write_valid_small(tmp_path / "s.gguf"))


def test_every_value_type_written_by_gguf_py_reads_back(tmp_path):
    path = tmp_path / "types.gguf"
    w = GGUFWriter(path, "test")
    w.add_uint8("t.u8", 200); w.add_int8("t.i8", -5); w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000); w.add_uint32("t.u32", 4_000_000_000); w.add_int32("t.i32", -7)
    w.add_uint64("t.u64", 2**63 + 5); w.add_int64("t.i64", -2**40); w.add_float32("t.f32", 0.5)
    w.add_float64("t.f64", 1e-300); w.add_bool("t.bool", True); w.add_string("t.str", "héllo")
    w.add_array("t.strs", ["a", "", "ç"]); w.add_array("t.ints", [1, -2, 3])
    w.add_array("t.floats", [0.25, 1.5]); w.add_array("t.bools", [True, False])
    values = np.arange(64, dtype=np.float32).reshape(2, 32)
    w.add_tensor("f32", values)
    w.add_tensor("f16", values.astype(np.float16))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    _assert_same_as_gguf_py(path)
    with GGUFFile.open(path) as gf:
        assert gf.kv_type["t.strs"] == (GGUFValueType.ARRAY, GGUFValueType.STRING)
        assert gf.get_int("t.u64") == 2**63 + 5 and gf.get_int("t.i8") == -5
        assert gf.get_int("missing", 3) == 3
        np.testing.assert_array_equal(gf.tensor_array("f32"), values)
        np.testing.assert_array_equal(gf.tensor_array("f16"), values.astype(np.float16))
        with pytest.raises(LuceError, match="expected an integer"):
            gf.get_int("t.f32")


def test_bf16_tensor_is_widened_exactly(tmp_path):
    # Values with 8 significant bits are exact in bf16; the raw bits are the top half of f32.
    values = np.array([[1.0, -2.5, 3.140625, 0.0] * 8], dtype=np.float32)
    bits = (values.view(np.uint32) >> 16).astype(np.uint16)
    path = tmp_path / "bf16.gguf"
    w = GGUFWriter(path, "test")
    w.add_tensor("x", bits, raw_dtype=GGMLQuantizationType.BF16)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    with GGUFFile.open(path) as gf:
        np.testing.assert_array_equal(gf.tensor_array("x"), values)


def test_every_proper_prefix_of_a_file_is_refused(tmp_path):
    data = write_valid_small(tmp_path / "s.gguf").read_bytes()
    cut = tmp_path / "cut.gguf"
    for n in range(len(data)):
        cut.write_bytes(data[:n])
        with pytest.raises(GGUFFormatError):
            GGUFFile.open(cut)


def test_random_byte_corruption_never_escapes_as_another_exception(tmp_path):
    data = bytearray(write_valid_small(tmp_path / "s.gguf").read_bytes())
    rng = np.random.default_rng(1234)
    bad = tmp_path / "bad.gguf"
    for _ in range(400):
        mutated = bytearray(data)
        for pos in rng.integers(0, len(data), size=rng.integers(1, 4)):
            mutated[pos] = rng.integers(0, 256)
        bad.write_bytes(bytes(mutated))
        try:
            GGUFFile.open(bad).close()
        except GGUFFormatError:
            pass


def test_missing_file_and_directory_are_unreadable(tmp_path):
    for path in (tmp_path / "nope.gguf", tmp_path):
        with pytest.raises(GGUFFormatError) as err:
            GGUFFile.open(path)
        assert err.value.exit_code == 2
