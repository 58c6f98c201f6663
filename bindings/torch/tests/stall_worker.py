"""A rank for test_harness.py: prints progress lines, then hangs (no torch needed).
STALL_LINES: how many "VERDICT" lines rank r prints (r + STALL_LINES), one every 0.2 s."""
import os
import time

R = int(os.environ["RANK"])
for k in range(R + int(os.environ.get("STALL_LINES", "1"))):
    print('VERDICT case%d "ok"' % k, flush=True)
    time.sleep(0.2)
time.sleep(600)
