"""Median isolated duration per kernel name from an ncu --csv --page raw log (tools/device/kernel_times.sh),
with the grid, block and dynamic shared memory of the first launch of each name, and the sum over one
decode step (the kernels between two embed_* launches). Python 3 standard library only."""
import csv
import statistics
import sys
from collections import defaultdict


def main(path):
    lines = [l for l in open(path) if l.startswith('"')]
    rows = list(csv.DictReader(lines))
    by = defaultdict(list)
    shape = {}
    seq = []
    for r in rows:
        name = r.get("Kernel Name", "").split("(")[0]
        try:
            t = float(r["gpu__time_duration.sum"].replace(",", ""))
        except (KeyError, ValueError):
            continue  # the units row
        by[name].append(t)
        shape.setdefault(name, (r.get("Grid Size", ""), r.get("Block Size", ""), r.get("Dynamic Shared Memory Size", "")))
        seq.append((name, t))
    print(f"{'kernel':36s} {'n':>5s} {'median ns':>10s} {'min':>8s} {'max':>8s}  grid / block / dyn smem")
    for name, ts in sorted(by.items(), key=lambda kv: -statistics.median(kv[1]) * len(kv[1])):
        print(f"{name:36s} {len(ts):5d} {statistics.median(ts):10.0f} {min(ts):8.0f} {max(ts):8.0f}  {' / '.join(shape[name])}")
    # One step: from an embed to the next.
    idx = [i for i, (n, _) in enumerate(seq) if n.startswith("embed_")]
    if len(idx) >= 2:
        step = seq[idx[0]:idx[1]]
        tot = defaultdict(float)
        for n, t in step:
            tot[n] += t
        print(f"one step: {len(step)} kernels, {sum(t for _, t in step) / 1e3:.1f} us isolated in all")
        for n, t in sorted(tot.items(), key=lambda kv: -kv[1]):
            print(f"  {n:36s} {t / 1e3:9.1f} us")
        print("one step, first 30 kernels in order (ns):", ", ".join(f"{n}:{t:.0f}" for n, t in step[:30]))


if __name__ == "__main__":
    try:
        main(sys.argv[1])
    except BrokenPipeError:  # piped into head
        pass
