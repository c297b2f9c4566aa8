"""What every benchmark script records about its run (the time, the commit, the NVIDIA driver, the copy ceiling), and
its JSON rule.

Imported by bench/torch_bench.py and bench/torch_ops_bench.py (bench/ is on the path of a script run from it).
"""

import datetime
import math
import os
import subprocess


def utc_now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def git_commit(given):
    """The commit the results belong to: the argument, else $RMSNORM_COMMIT, else git's short HEAD."""
    if given:
        return given
    if os.environ.get("RMSNORM_COMMIT"):
        return os.environ["RMSNORM_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def driver_version():
    """The NVIDIA driver version nvidia-smi reports (not the CUDA driver API version)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        if out.returncode == 0:
            return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        pass
    return "unavailable"


def json_safe(x):
    """NaN and inf as null (strict JSON readers reject them), through dicts and lists."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, list):
        return [json_safe(v) for v in x]
    return x


COPY_BYTES = 1 << 30


def copy_times_us(torch, device, reps):
    """The copy ceiling's samples: `reps` timings (us, CUDA events) of dst.copy_(src) of 1 GiB on `device`, after 3
    warm-up copies; each moves 2 * COPY_BYTES (read + write). The buffers are freed and the cache emptied after."""
    src = torch.randint(0, 256, (COPY_BYTES,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    stops = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for r in range(reps):
        starts[r].record()
        dst.copy_(src)
        stops[r].record()
    torch.cuda.synchronize()
    del src, dst
    torch.cuda.empty_cache()
    return [1e3 * a.elapsed_time(b) for a, b in zip(starts, stops)]
