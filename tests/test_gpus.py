"""One table of GPUs and one name matcher (nanochat/gpus.py), and one reader of the committed
measurements (nanochat/measurements.py). Five rules used to answer "which GPU is this?": MFU's
peak by substring (common.py), the memory planner's by key sets (memory.py), the bytes-in-flight
estimate's by case-sensitive substring (in_flight.py), the plan's by words (plan.py), `auto`'s
by the exact name. Every name each of them took names the same GPU now, but where the old rule
was wrong: those names are listed below with the reason."""

import ast
import math
from pathlib import Path

import pytest

from nanochat import gpus, measurements
from nanochat.connections.backends import auto

REPO = Path(__file__).resolve().parent.parent

# The old rules, as they were (nanochat 3b9bdb0), each a (key, value) table and its matcher.
OLD_PEAK = [
    ("H200", 989e12), ("H100 NVL", 835e12), ("H100 PCIe", 756e12), ("H100", 989e12), ("H800", 989e12),
    ("B200", 2250e12), ("GH200", 989e12), ("A100", 312e12), ("A800", 312e12), ("L40S", 362e12),
    ("RTX PRO 6000", 503.8e12), ("RTX 6000 Ada", 364.2e12), ("4090", 165.2e12), ("3090", 71e12), ("A10G", 70e12),
]
OLD_MEMORY = [
    (("H200",), 141), (("H100", "NVL"), 94), (("H100",), 80), (("A100", "40GB"), 40), (("A100",), 80),
    (("L40S",), 48), (("RTX PRO 6000",), 96),
]
OLD_IN_FLIGHT = [("A100", (2.0e12, 108, 80)), ("H100", (3.35e12, 132, 90)), ("H200", (4.8e12, 132, 90))]


def old_peak(name):
    return next((flops for key, flops in OLD_PEAK if key.lower() in name.lower()), math.inf)


def old_memory(name):
    return next((gib for keys, gib in OLD_MEMORY if all(k.lower() in name.lower() for k in keys)), None)


def old_in_flight(name):
    return next((figures for key, figures in OLD_IN_FLIGHT if key in name), None)


# As torch and nvidia-smi name them, and as the README and a user write them.
NAMES = [
    "NVIDIA H200", "NVIDIA H200 NVL", "NVIDIA H100 80GB HBM3", "NVIDIA H100", "NVIDIA H100 PCIe", "NVIDIA H100 NVL",
    "NVIDIA H800", "NVIDIA B200", "NVIDIA GH200 480GB", "NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-40GB",
    "NVIDIA A100-PCIE-40GB", "NVIDIA A100 80GB PCIe", "NVIDIA A800-SXM4-80GB", "NVIDIA L40S", "NVIDIA L40",
    "NVIDIA RTX PRO 6000 Blackwell Server Edition", "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
    "NVIDIA RTX 6000 Ada Generation", "Quadro RTX 6000", "NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 3090",
    "NVIDIA A10G", "NVIDIA RTX A1000", "Tesla T4", "Quadro K600",
    "H200", "h200", "H100", "H100 SXM", "A100", "A100 40GB", "a100 80 GB", "L40S", "RTX PRO 6000",
]
# Where an old rule was wrong, what the table says instead.
WRONG_PEAK = {
    "NVIDIA RTX A1000": math.inf,  # "A100" is a substring of "A1000": it was given an A100's 312 TFLOP/s
}
WRONG_MEMORY = {
    "NVIDIA GH200 480GB": None,  # "H200" is a substring of "GH200": it was given an H200's 141 GiB (its GPU has
    # 96 GB HBM3, or 144 GB HBM3e by edition)
    "NVIDIA RTX A1000": None,  # "A100" in "A1000": an A100's 80 GiB
}
WRONG_IN_FLIGHT = {
    "NVIDIA H100 PCIe": (2.0e12, 114, 90),  # "H100" in its name: an H100 SXM's 3.35 TB/s and 132 SMs
    "NVIDIA H100 NVL": (3.9e12, 132, 90),  # likewise: the NVL's HBM3 runs at 3.9 TB/s
    "NVIDIA A100-SXM4-40GB": (1.555e12, 108, 80),  # the 80 GB A100's 2.0 TB/s; the 40 GB one has 1.555
    "NVIDIA A100-PCIE-40GB": (1.555e12, 108, 80), "A100 40GB": (1.555e12, 108, 80),
    "NVIDIA GH200 480GB": (None, None, 90),  # "H200" in "GH200": an H200's figures
    "NVIDIA RTX A1000": None,  # "A100" in "A1000"
}


@pytest.mark.parametrize("name", NAMES)
def test_every_name_an_old_rule_took_names_the_same_gpu(name):
    gpu = gpus.lookup(name)
    assert gpus.peak_flops(name) == WRONG_PEAK.get(name, old_peak(name))
    assert gpus.memory_gib(name) == WRONG_MEMORY.get(name, old_memory(name))
    expected = WRONG_IN_FLIGHT.get(name, old_in_flight(name))
    if expected is not None:
        assert (gpu.bandwidth, gpu.sms, gpu.cc) == expected
    elif gpu is not None and gpu not in (gpus.A100, gpus.H100, gpus.H200):  # (it took no lower case)
        assert gpu.bandwidth is None  # what the in-flight rule did not know has no bandwidth here either
    # `auto` took a measurement for the GPU of the same name exactly; a name is its own GPU
    assert gpus.same_gpu(name, name)


def test_the_most_specific_entry_wins_and_names_need_their_words():
    assert gpus.lookup("NVIDIA H100 NVL").name == "H100 NVL" and gpus.lookup("NVIDIA H100 80GB HBM3").name == "H100"
    assert gpus.lookup("NVIDIA A100-SXM4-40GB").name == "A100 40GB" and gpus.lookup("A100 80GB").name == "A100"
    assert gpus.lookup("NVIDIA RTX 6000 Ada Generation").name == "RTX 6000 Ada"
    assert gpus.lookup("NVIDIA GH200 480GB").name == "GH200" and gpus.lookup("NVIDIA L40") is None
    assert gpus.words("NVIDIA A100-SXM4-80GB") == (frozenset({"a100"}), 80)


def test_the_table_has_one_entry_per_name():
    keys = [gpus.words(g.name) for g in gpus.GPUS]
    assert len(keys) == len(set(keys))
    assert {g.name for g in (gpus.A100, gpus.H100, gpus.H200)} <= {g.name for g in gpus.GPUS}


def test_auto_takes_the_measurement_of_the_same_gpu_by_the_one_rule():
    steps = {("NVIDIA H200", "kromhc", "torch"): 2.0, ("NVIDIA H200", "kromhc", "fused"): 1.6}
    assert measurements.on_gpu(steps, "NVIDIA H200", "kromhc", ["torch", "fused"]) == {"torch": 2.0, "fused": 1.6}
    assert measurements.on_gpu(steps, "NVIDIA GH200 480GB", "kromhc", ["torch", "fused"]) == {}
    assert measurements.on_gpu(steps, None, "kromhc", ["torch", "fused"]) == {}
    assert auto.choose("kromhc", "NVIDIA H200", ["torch", "fused"], steps).backend == "fused"


def test_the_committed_measurements_are_read_in_one_place():
    """No module but nanochat/measurements.py names a committed measurement file in its code
    (docstrings and comments may cite them)."""
    committed = ("gpu_check.json", "gpu_check_fused.json", "kernels.json", "traffic.json", "bench_seams.json")
    for path in (REPO / "nanochat").rglob("*.py"):
        if path.name == "measurements.py":
            continue
        tree = ast.parse(path.read_text())
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef)) and n.body
                      and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                assert not any(node.value.endswith(name) for name in committed), (path, node.value)
    assert measurements.read(measurements.GPU_CHECK)["env"]["device_name"]
    assert measurements.kernels() and measurements.step_ratios()
