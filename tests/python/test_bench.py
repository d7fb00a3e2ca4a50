"""python -m flashattn.bench (the side-by-side benchmark) on the CPU with the tiny grid: every pass runs, the JSON
holds every reading with rates and ratios that follow from them, the table has a row per cell, the chart is a PNG,
a library that cannot run a cell is reported, and bad options exit with code 2 naming the option."""
import json
import subprocess
import sys

import pytest
import torch

import flashattn
from flashattn import bench


def test_tiny_grid_every_pass(tmp_path, capsys):
    out = tmp_path / "bench.json"
    argv = ["--device", "cpu", "--grid", "tiny", "--pass", "forward", "backward", "decode", "--repeats", "2",
            "--seconds", "0.005", "--json", str(out), "--no-progress"]
    assert bench.main(argv) == 0
    printed = capsys.readouterr().out
    data = json.loads(out.read_text())
    grid = bench.GRIDS["tiny"]
    attention_cells = len(grid["seqlens"]) * len(grid["head_dims"]) * 2  # causal and not
    assert len(data["cells"]) == 2 * attention_cells + len(bench.DECODE["tiny"]["cells"])
    assert data["meta"]["libraries"] == ["flashattn", "sdpa"] and data["meta"]["dtype"] == "fp32"
    for cell in data["cells"]:
        assert not cell["unsupported"], cell["unsupported"]
        readings = cell["libraries"]
        assert set(readings) == {"flashattn", "sdpa"}
        for entry in readings.values():
            assert len(entry["seconds"]) == 2 and all(t > 0 for t in entry["seconds"])
            assert entry["best_seconds"] == min(entry["seconds"])
            assert entry["rate"] == pytest.approx(bench.work_of(cell, torch.float32) / entry["best_seconds"])
        ratios = cell["ratios"]["sdpa"]
        want = [s / o for o, s in zip(readings["flashattn"]["seconds"], readings["sdpa"]["seconds"])]
        assert ratios == pytest.approx(want)
    rows = [line for line in printed.splitlines() if line.startswith("| forward") or line.startswith("| backward")
            or line.startswith("| decode")]
    assert len(rows) == len(data["cells"])
    # The decode table: a row per decode cell with µs per call = the best burst, and no share of an unknown peak.
    decode = [c for c in data["cells"] if c["pass"] == "decode"]
    lines = printed.split("Decode: µs per call")[1].splitlines()[3:3 + len(decode)]
    for line, cell in zip(lines, decode):
        fields = [f.strip() for f in line.strip("|").split("|")]
        assert fields[:2] == [str(cell["b"]), str(cell["s"])]
        assert float(fields[4]) == pytest.approx(cell["libraries"]["flashattn"]["best_seconds"] * 1e6, rel=0.06)
        assert fields[6] == "n/a"


def test_decode_table_share_of_peak():
    cell = dict(b=2, s=64, h=4, h_kv=2, d=16, dv=16, causal=False, device="cpu", unsupported={})
    cell["pass"] = "decode"
    cell["libraries"] = {"flashattn": dict(best_seconds=2e-6, rate=3.0e12),
                         "sdpa": dict(best_seconds=4e-6, rate=1.5e12)}
    text = bench.decode_table([cell], ["flashattn", "sdpa"], 4800.0)
    assert "| 2 | 64 | 4/2 | 16 | 2.0 | 3e+03 | 62% | 4.0 | 1.5e+03 |" in text


def test_work_counts():
    cell = dict(pass_="forward", b=2, h=3, s=4, d=8, dv=16, causal=True)
    cell["pass"] = cell.pop("pass_")
    assert bench.work_of(cell, torch.float32) == 2.0 * 2 * 3 * 16 * (8 + 16) / 2
    cell["pass"], cell["causal"] = "backward", False
    assert bench.work_of(cell, torch.float32) == 2.5 * 2.0 * 2 * 3 * 16 * (8 + 16)
    decode = dict(b=2, s=100, h=8, h_kv=2, d=16, dv=16, causal=False)
    decode["pass"] = "decode"
    assert bench.work_of(decode, torch.bfloat16) == 2 * 100 * 2 * 32 * 2  # K and V bytes


def test_shape_option_one_causal_setting_and_a_chosen_backend(capsys):
    """--against math selects SDPA's math backend for every burst (a context entered per burst, not reused)."""
    assert bench.main(["--device", "cpu", "--shape", "1,40,2,24,16", "--causal", "yes", "--pass", "forward",
                       "backward", "--against", "sdpa", "math", "--repeats", "2", "--seconds", "0.005",
                       "--no-progress"]) == 0
    printed = capsys.readouterr().out
    rows = [line for line in printed.splitlines() if line.startswith(("| forward", "| backward"))]
    assert len(rows) == 2 and all("| 24/16 | yes |" in r for r in rows) and "n/a" not in printed


def test_a_library_that_cannot_run_a_cell_is_reported(monkeypatch, capsys):
    real = bench._attention_call

    def refuse_sdpa(lib, cell, dtype, device):
        if lib == "sdpa":
            raise RuntimeError("no kernel for this shape")
        return real(lib, cell, dtype, device)

    monkeypatch.setattr(bench, "_attention_call", refuse_sdpa)
    assert bench.main(["--device", "cpu", "--shape", "1,32,2,16", "--causal", "no", "--pass", "forward",
                       "--repeats", "1", "--seconds", "0.005", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "n/a: sdpa: RuntimeError: no kernel for this shape" in printed
    assert "| forward | 1 | 32 | 2 | 16/16 | no | GFLOP/s |" in printed


def test_chart(tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "bench.png"
    assert bench.main(["--device", "cpu", "--grid", "tiny", "--pass", "forward", "decode", "--causal", "no",
                       "--repeats", "1", "--seconds", "0.005", "--png", str(png), "--no-progress"]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("argv, option", [
    (["--shape", "1,2,3"], "--shape"),
    (["--shape", "1,0,2,8"], "--shape"),
    (["--repeats", "0"], "--repeats"),
    (["--seconds", "-1"], "--seconds"),
    (["--device", "cpu", "--against", "cudnn"], "--against"),
    (["--device", "cpu", "--pass", "sideways"], "--pass"),
    (["--threads", "-2"], "--threads"),
])
def test_bad_options_exit_2_naming_the_option(argv, option, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(argv)
    assert exit_info.value.code == 2
    assert option in capsys.readouterr().err


@pytest.mark.skipif(flashattn.built_with_cuda and torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_cuda_requested_without_a_gpu(capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--device", "cuda"])
    assert exit_info.value.code == 2 and "--device cuda" in capsys.readouterr().err


def test_runs_as_a_module():
    done = subprocess.run([sys.executable, "-m", "flashattn.bench", "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "--pass" in done.stdout and "alternating" in done.stdout


@pytest.mark.cuda
def test_gpu_quick_cell():
    if not (flashattn.built_with_cuda and torch.cuda.is_available()):
        pytest.skip("needs a CUDA device and a build with the CUDA kernels")
    assert bench.main(["--device", "cuda", "--shape", "2,512,4,64", "--causal", "both", "--pass", "forward",
                       "backward", "decode", "--grid", "tiny", "--against", "cudnn", "flash", "math",
                       "--repeats", "1", "--seconds", "0.01", "--no-progress"]) == 0
