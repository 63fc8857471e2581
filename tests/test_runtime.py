"""Process-wide set-up (services/runtime.py): glibc's malloc keeps freed tensor memory for the next step."""

import ctypes
import subprocess
import sys

import pytest

PROBE = """
import ctypes, resource, sys, torch

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                                               "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
if sys.argv[1] == "set":
    from rlcli.services.runtime import reuse_freed_memory
    assert reuse_freed_memory() and reuse_freed_memory()  # set once; asking again answers the same
def step():  # a step's activations: 8 tensors of 1 MB, written, then freed together
    tensors = [torch.ones(2**18) for _ in range(8)]
    del tensors

for _ in range(3):
    step()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):
    step()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
mapped = libc.mallinfo2().hblkhd
big = torch.ones(2**22)  # 16 MB: its own mmap, or from the heap
print(libc.mallinfo2().hblkhd - mapped, faults)
"""


def probe(mode: str) -> tuple[int, int]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    mapped, faults = out.stdout.split()
    return int(mapped), int(faults)


@pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "mallinfo2"), reason="glibc 2.33+'s mallinfo2")
def test_a_training_process_keeps_freed_tensor_memory_for_the_next_steps():
    """With glibc's defaults a tensor over 128 kB gets its own mmap, and the heap's free top goes back to the OS, so
    steps fault in fresh pages (0-2,016 minor faults over these 50 steps, depending on the heap's layout, when this
    was written). With a training process's settings (configure_torch sets them) a 16 MB tensor comes from the heap
    and the steps reuse its memory."""
    default_mapped, _ = probe("default")
    assert default_mapped >= 2**24
    mapped, faults = probe("set")
    assert mapped == 0 and faults < 20
