"""The GPUs the project knows, from NVIDIA's data sheets, and the one rule that names them.

"Which GPU is this?" has one answer here for every caller: MFU (peak bf16 FLOP/s), the memory
planner (memory), the bytes-in-flight estimate (bandwidth, SMs, compute capability), the plan
(which measurement prices which GPU) and `hc_kernels = auto` (which measurement is this GPU's).

A name, as torch or nvidia-smi gives it or as the README writes it ("NVIDIA A100-SXM4-40GB",
"A100 40GB", "h200"), is read as words (`words`): lower case, the words that tell it from no
other GPU dropped (vendor and brand, the form factor and memory type a GPU without "PCIe" or
"NVL" in its name has anyway, nvidia-smi's architecture and edition words), and the memory it
states in GB apart. A table entry is named the same way: it matches a name that holds all its
words and, where the entry states a memory, states the same one; the most specific entry that
matches wins ("NVIDIA H100 NVL" is the H100 NVL, not the H100; "NVIDIA A100-SXM4-40GB" the A100
40GB). `same_gpu` compares two names by the same words.

A field the table leaves None is one no part of the project has needed for that GPU yet: add it
from the data sheet when one does. Nothing of nanochat is imported here (the connections' `auto`
reads it, and the connections import only leaf modules).
"""

import dataclasses
import math
import re


@dataclasses.dataclass(frozen=True)
class GPU:
    name: str  # as the table names it; its words are the key (`words`)
    bf16_flops: float | None = None  # dense bf16 peak FLOP/s (not the "with sparsity" figure)
    memory_gib: float | None = None  # HBM/GDDR, binary (an "80GB" H100 reports 79.2 GiB to torch)
    bandwidth: float | None = None  # DRAM bytes/s, the data sheet's peak
    sms: int | None = None
    cc: int | None = None  # compute capability, as kernel_aot.TARGETS (90: sm_90)


# NVIDIA's data sheets (the product pages of each GPU; the dense bf16 figure). The bytes-in-flight
# check holds kernels to the A100 (80 GB SXM: 2.0 TB/s HBM2e, 108 SMs), H100 (SXM: 3.35 TB/s HBM3,
# 132 SMs) and H200 (SXM: 4.8 TB/s HBM3e, 132 SMs); the H100 PCIe (2.0 TB/s HBM2e, 114 SMs), H100
# NVL (3.9 TB/s HBM3) and A100 40GB (1.555 TB/s HBM2) have their own.
A100 = GPU("A100", 312e12, 80, 2.0e12, 108, 80)
H100 = GPU("H100", 989e12, 80, 3.35e12, 132, 90)
H200 = GPU("H200", 989e12, 141, 4.8e12, 132, 90)
GPUS = (
    A100, GPU("A100 40GB", 312e12, 40, 1.555e12, 108, 80), GPU("A800", 312e12, cc=80),
    H100, GPU("H100 PCIe", 756e12, 80, 2.0e12, 114, 90), GPU("H100 NVL", 835e12, 94, 3.9e12, 132, 90),
    GPU("H800", 989e12, cc=90), H200, GPU("GH200", 989e12, cc=90), GPU("B200", 2250e12, cc=100),
    GPU("L40S", 362e12, 48, cc=89), GPU("RTX 6000 Ada", 364.2e12, cc=89), GPU("RTX PRO 6000", 503.8e12, 96, cc=120),
    GPU("RTX 4090", 165.2e12, cc=89), GPU("RTX 3090", 71e12, cc=86), GPU("A10G", 70e12, cc=86),
)

# Words of a GPU's name that tell it from no other GPU: the vendor and brand, the form factor
# and memory type a GPU without "PCIe" or "NVL" in its name has anyway (SXM, HBM), and the
# architecture and edition words nvidia-smi adds ("NVIDIA RTX PRO 6000 Blackwell Server
# Edition"). The words left (the model, "PCIe", "NVL", "Ada", "Max-Q") tell GPUs apart.
NOISE = frozenset({"nvidia", "tesla", "geforce", "sxm", "sxm2", "sxm4", "sxm5", "hbm2", "hbm2e", "hbm3",
                   "hbm3e", "blackwell", "server", "workstation", "edition", "generation"})
_GB = re.compile(r"(\d+)gb")


def words(name):
    """The words of a GPU's name that tell it from other GPUs, lower case, and the memory the
    name states in GB (None where it states none): "NVIDIA A100-SXM4-80GB" -> ({"a100"}, 80)."""
    text = re.sub(r"(\d+)\s*gb\b", r"\1gb", name.lower())
    kept = [w for w in re.split(r"[\s_-]+", text) if w and w not in NOISE]
    stated = [int(m.group(1)) for w in kept if (m := _GB.fullmatch(w))]
    return frozenset(w for w in kept if not _GB.fullmatch(w)), (stated[0] if stated else None)


def lookup(name):
    """The GPU of the table a name names (the most specific entry whose words it holds, and its
    stated memory where the entry states one), or None."""
    held, stated = words(name)
    best, rank = None, -1
    for gpu in GPUS:
        keys, memory = words(gpu.name)
        if keys and keys <= held and memory in (None, stated) and len(keys) + (memory is not None) > rank:
            best, rank = gpu, len(keys) + (memory is not None)
    return best


def peak_flops(name):
    """Dense bf16 peak FLOP/s of the GPU a name names, or inf when unknown (MFU then reads 0)."""
    gpu = lookup(name)
    return gpu.bf16_flops if gpu and gpu.bf16_flops else math.inf


def memory_gib(name):
    """The data sheet's memory of the GPU a name names, in GiB, or None when unknown."""
    gpu = lookup(name)
    return gpu.memory_gib if gpu else None


def stated_memory(name):
    """The memory a name means, in GB: the one it states, else the table's for that name (a bare
    "A100" is the 80 GB one); None where neither says."""
    stated = words(name)[1]
    return stated if stated is not None else memory_gib(name)


def same_gpu(name, device):
    """Whether the GPU named (PLAN_GPU: as nvidia-smi names it or as the README writes it,
    "H200", "A100 40GB", in any case, with or without "NVIDIA") is the device a measurement
    names: the same distinguishing words (H100 is not the H100 NVL, the H100 PCIe or the H200)
    and the same memory where both names imply one (A100 40GB is not the A100-SXM4-80GB)."""
    held, device_held = words(name)[0], words(device)[0]
    if not held or held != device_held:
        return False
    memory, device_memory = stated_memory(name), stated_memory(device)
    return memory is None or device_memory is None or memory == device_memory
