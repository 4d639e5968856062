"""The GPU's own weight layouts (docs/gpu.md): the upload rewrites IQ4_XS, IQ4_NL and Q6_K blocks in place
(native/gpu/quant_blocks.cuh) so the kernels decode them with fewer instructions. The values must
stay GGUF's to the bit. tests/native/gpu_layouts.cu runs the device's conversion and its
dequantizer of the converted bytes on the host; here they meet gguf's own dequantization of the
original blocks, which nobody here wrote. Random blocks reach every code and bit pattern; a Q6_K
tensor of an odd number of blocks has blocks of both parities (the layout differs between them).

The fragment kernel's bulk copies (native/gpu/bulk_copy.cuh) move 16-byte-aligned windows around
a row's groups into fixed-size shared buffers: the windows must cover the run, stay within 15
bytes of it, and never exceed the buffer, at every alignment a row can have. Its tensor-map boxes
must start on a 16-byte boundary, cover the run from there, fit the same buffer, and be an odd
number of 16-byte words wide (rows land back to back: consecutive rows on different banks).
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as Q
from gguf.quants import dequantize

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "tests" / "native" / "gpu_layouts.cu"


@pytest.fixture(scope="module")
def program(tmp_path_factory) -> Path:
    nvcc = shutil.which("nvcc")
    if nvcc is None:  # the GPU backend is not built either (test_gpu_build.py)
        pytest.skip("nvcc is not installed: the GPU sources cannot be compiled here")
    exe = tmp_path_factory.mktemp("layouts") / "gpu_layouts"
    include = [f"-I{REPO / d}" for d in ("native/include", "native/src", "native/gpu")]
    subprocess.run([nvcc, "-std=c++17", *include, str(SOURCE), "-o", str(exe)], check=True, capture_output=True)
    return exe


def _random_blocks(qtype: Q, n_blocks: int, seed: int) -> np.ndarray:
    _, block_bytes = GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (n_blocks, block_bytes), dtype=np.uint8)
    d = rng.uniform(-2.0, 2.0, n_blocks).astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
    at = 0 if qtype in (Q.IQ4_XS, Q.IQ4_NL) else block_bytes - 2  # where the block's f16 d sits
    blocks[:, at:at + 2] = d  # a finite scale: random bytes may spell inf or NaN
    return blocks


def _through_gpu_layout(program: Path, name: str, blocks: np.ndarray) -> np.ndarray:
    out = subprocess.run([str(program), name], input=blocks.tobytes(), capture_output=True, check=True).stdout
    return np.frombuffer(out, dtype=np.float32)


@pytest.mark.parametrize("qtype, name", [(Q.IQ4_XS, "iq4_xs"), (Q.IQ4_NL, "iq4_nl"), (Q.Q6_K, "q6_k")])
def test_gpu_layout_keeps_gguf_values(program, qtype, name):
    blocks = _random_blocks(qtype, 257, seed=int(qtype))
    want = dequantize(blocks, qtype).reshape(-1).astype(np.float32)
    got = _through_gpu_layout(program, name, blocks)
    assert got.shape == want.shape
    # Same values, same fp32 products up to the order of one multiply (d * scale first here).
    np.testing.assert_allclose(got, want, rtol=2e-7, atol=0)


def test_gpu_layout_program_refuses_partial_blocks(program):
    proc = subprocess.run([str(program), "q6_k"], input=b"\0" * 211, capture_output=True)
    assert proc.returncode == 2 and b"not a whole number of blocks" in proc.stderr


# Two groups of each type the row copies serve, and one (a part's odd last copy).
@pytest.mark.parametrize("span", [136, 272, 210, 420])
def test_bulk_copy_windows_cover_the_run_and_fit_the_buffer(program, span):
    out = subprocess.run([str(program), "windows", str(span)], capture_output=True, check=True, text=True).stdout
    rows = [tuple(int(v) for v in line.split()) for line in out.splitlines()]
    assert len(rows) == 64
    worst = max(-(-(offset + span) // 16) * 16 for offset in range(16))  # ceil16 of the run at each alignment
    for a, end, first, n_bytes, buffer in rows:
        assert end - a == span
        assert first % 16 == 0 and n_bytes % 16 == 0  # cp.async.bulk's alignment rules
        assert first <= a < first + 16 and end <= first + n_bytes < end + 16
        assert n_bytes <= buffer == worst


# Two groups of IQ4_XS (FFN down's parts start 8 bytes past a word), Q5_K and Q8_0, and spans that
# are not whole words (every lead then possible).
@pytest.mark.parametrize("span", [272, 352, 544, 136, 210, 420])
def test_tensor_map_boxes_cover_the_run_fit_the_buffer_and_stagger_banks(program, span):
    out = subprocess.run([str(program), "boxes", str(span)], capture_output=True, check=True, text=True).stdout
    rows = [tuple(int(v) for v in line.split()) for line in out.splitlines()]
    assert [lead for lead, _ in rows] == list(range(16))
    buffer = (span + 30) // 16 * 16 + 16  # a row buffer: the longest window around the span, + 16
    for lead, box in rows:
        assert box % 16 == 0 and (box // 16) % 2 == 1
        assert lead + span <= box <= buffer
        assert box < lead + span + 32  # at most one word past the run's last one


# The 27B's widths, by hand: IQ4_XS 272 = 17 words; FFN down's parts 8 + 272 -> 18 words -> 19;
# Q5_K 352 = 22 words -> 23; Q8_0 544 = 34 -> 35.
@pytest.mark.parametrize("span, lead, box", [(272, 0, 272), (272, 8, 304), (352, 0, 368), (544, 0, 560)])
def test_tensor_map_box_widths_of_the_27b(program, span, lead, box):
    out = subprocess.run([str(program), "boxes", str(span)], capture_output=True, check=True, text=True).stdout
    assert dict(tuple(int(v) for v in line.split()) for line in out.splitlines())[lead] == box
