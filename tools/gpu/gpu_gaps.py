"""The GPU's idle time in an Nsight Systems trace (sqlite export): kernels and copies merged into
busy intervals on the device's timeline, over the middle 60% of the trace (steady decoding), and
the gaps between them by size. Usage: gpu_gaps.py TRACE.sqlite"""
import sqlite3
import sys

db = sqlite3.connect(sys.argv[1])
spans = []
for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
    try:
        spans += db.execute(f"SELECT start, end FROM {table}").fetchall()
    except sqlite3.OperationalError:
        pass
if not spans:
    sys.exit("no kernels in the trace")
spans.sort()
first, last = spans[0][0], max(e for _, e in spans)
lo, hi = first + 0.2 * (last - first), first + 0.8 * (last - first)
busy, gaps, cur_s, cur_e = 0, [], None, None
for s, e in spans:
    if e < lo or s > hi:
        continue
    if cur_e is None:
        cur_s, cur_e = s, e
    elif s > cur_e:
        busy += cur_e - cur_s
        gaps.append(s - cur_e)
        cur_s, cur_e = s, e
    else:
        cur_e = max(cur_e, e)
busy += cur_e - cur_s
window = hi - lo
print(f"window {window / 1e6:.1f} ms: GPU busy {100 * busy / window:.1f}%, idle {(window - busy) / 1e6:.2f} ms")
for lo_us, hi_us in ((0, 2), (2, 5), (5, 10), (10, 20), (20, 50), (50, 100), (100, 1e9)):
    sel = [g for g in gaps if lo_us * 1e3 <= g < hi_us * 1e3]
    print(f"gaps {lo_us:>3}-{hi_us if hi_us < 1e9 else 'inf'} us: {len(sel):6d}, {sum(sel) / 1e6:.2f} ms")
