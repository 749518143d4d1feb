"""What process start to the first batch is made of: fresh processes, interleaved.

Four commands, each run N times in turn (`N` from the environment, 15 by default), wall time
from spawning to exit:
- the interpreter alone (`python -c pass`);
- `import numpy`: what any package returning numpy arrays pays before its first array;
- `import tfpipe` (numpy included);
- the first batch of the pipelines.py job (interleave 4, shuffle 10k, batch 256, parse), the
  process exiting right after it.

    python python/benchmarks/pipelines.py --make     # writes /tmp/mnist500k once
    python python/benchmarks/startup.py [PYTHON]     # PYTHON: an interpreter with tfpipe
"""

import os
import statistics
import subprocess
import sys
import time

FIRST_BATCH = r"""
import glob, os, tfpipe
ds = (tfpipe.Dataset.tfrecord(sorted(glob.glob("/tmp/mnist500k/mnist-*.tfrecord"))).interleave(4, 16)
      .shuffle(10_000, seed=0).batch(256).parse(["image_raw:uint8:28x28", "label:int64"]).prefetch(2))
b = next(iter(ds))
os._exit(0)
"""

CASES = {
    "python -c pass": "pass",
    "import numpy": "import numpy",
    "import tfpipe": "import tfpipe",
    "tfpipe first batch": FIRST_BATCH,
}


def main() -> None:
    python = sys.argv[1] if len(sys.argv) > 1 else sys.executable
    rounds = int(os.environ.get("N", "15"))
    times = {name: [] for name in CASES}
    for _ in range(rounds):
        for name, code in CASES.items():
            start = time.perf_counter()
            subprocess.run([python, "-c", code], check=True)
            times[name].append((time.perf_counter() - start) * 1e3)
    for name, ms in times.items():
        ms.sort()
        print(f"{name:22s} median {statistics.median(ms):6.1f} ms  min {ms[0]:6.1f}  max {ms[-1]:6.1f}")
    print("load average", open("/proc/loadavg").read().strip())


if __name__ == "__main__":
    main()
