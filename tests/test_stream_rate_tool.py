"""``tools/tma_stream_rate.cu`` (the bare TMA stream a decode's cache is measured against) builds
for sm_90a with the pinned toolkit, its three ways of copying a tile in the program."""
import pathlib
import subprocess

from tests.helpers import needs_nvcc

TOOL = pathlib.Path(__file__).parents[1] / "tools" / "tma_stream_rate.cu"


@needs_nvcc
def test_the_stream_rate_program_builds_for_sm_90a(tmp_path):
    made = subprocess.run(["nvcc", "-O2", "-arch=sm_90a", "-std=c++17", "-ptx", str(TOOL), "-o",
                           str(tmp_path / "rate.ptx")], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    ptx = (tmp_path / "rate.ptx").read_text()
    for copy in ("cp.async.bulk.tensor.2d", "cp.async.bulk.tensor.4d",
                 "cp.async.bulk.shared::cluster.global"):
        assert copy in ptx, copy
