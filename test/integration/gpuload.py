"""Keeps GPU 0 busy for the given seconds (default 60) and holds 8 GiB on it:
the load of TestRealGPUThroughTheAgent (make gpu-check). Needs PyTorch."""
import sys
import time

import torch

seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 60.0
held = torch.empty(8 << 30, dtype=torch.uint8, device="cuda:0")
a = torch.randn(8192, 8192, device="cuda:0", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda:0", dtype=torch.bfloat16)
print(f"gpuload: {torch.cuda.get_device_name(0)} busy for {seconds:.0f} s", flush=True)
end = time.monotonic() + seconds
while time.monotonic() < end:
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
print("gpuload: done", flush=True)
