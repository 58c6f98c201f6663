#!/usr/bin/env python3
"""Model of init time and of the bootstrap root's bytes, fitted to perf/init_scale.sh's raw
runs, checked against every measured point, extrapolated to 16k ranks.

  perf/init_model.py perf/results/init_scale.md.raw [--ranks-per-host 8] [--at 16384]

Root bytes are exact sums of frame sizes, so they are fitted as a*n + b*n^2 and must match
every point to the byte. With SHOAL_BOOT_EXCHANGE=root the n^2 term is the table every rank
receives (n records each); with SHOAL_BOOT_EXCHANGE=ring (the default) the root's part is
one RING round of O(1) bytes per rank and the barrier, so b is 0 and the records travel
around the ring instead: 2 rounds (host identities, transport addresses) of n-1 steps, each
one hop of latency L (--hop-us, default 30 us) plus one record at B, on the critical path of
every rank. Both the root's time and the ring's are printed for the cluster projection.

Time on one host with C CPUs is the CPU work of all ranks shared by C CPUs:
    T(n) = t0 + (n * w_rank + P(n) * w_pair) / C
with P(n) = n(n-1)/2 the pairs that connect at init (all-to-all) and w_rank the work of one
rank's init (process start, topology discovery, its segment). w_rank and w_pair are fitted by
least squares; the table says how far each measured point is from the fit. On a cluster of
16k ranks with R ranks per host, every host runs its own R ranks: a rank's init costs
    T_cluster(n) = t0 + R * w_rank / C + (n - 1) * w_pair_per_rank + root(n)
where each rank does its half of its n-1 handshakes (all-to-all) and root(n) is the time the
root needs to write its bytes at B bytes/s (1.25 GB/s: 10 Gbit/s) plus per-rank service; with
the ring exchange add ring(n) = 2 (n-1) (L + rec/B), rec the mean record (--rec, default 400 B).
"""
import sys

def fit(xs, ys, basis):
    # least squares by the normal equations (no numpy needed)
    m = len(basis)
    A = [[sum(basis[i](x) * basis[j](x) for x in xs) for j in range(m)] for i in range(m)]
    b = [sum(basis[i](x) * y for x, y in zip(xs, ys)) for i in range(m)]
    for c in range(m):
        p = max(range(c, m), key=lambda r: abs(A[r][c]))
        A[c], A[p], b[c], b[p] = A[p], A[c], b[p], b[c]
        for r in range(m):
            if r != c and A[c][c] != 0:
                f = A[r][c] / A[c][c]
                A[r] = [a - f * q for a, q in zip(A[r], A[c])]
                b[r] -= f * b[c]
    return [b[i] / A[i][i] if A[i][i] else 0.0 for i in range(m)]

def main():
    args = sys.argv[1:]
    raw = args[0]
    R = int(args[args.index("--ranks-per-host") + 1]) if "--ranks-per-host" in args else 8
    N = int(args[args.index("--at") + 1]) if "--at" in args else 16384
    C = int(args[args.index("--cpus") + 1]) if "--cpus" in args else 2
    hop = float(args[args.index("--hop-us") + 1]) * 1e-6 if "--hop-us" in args else 30e-6
    rec = float(args[args.index("--rec") + 1]) if "--rec" in args else 400.0
    B = 1.25e9
    pts = {}
    bytes_ = {}
    for line in open(raw):
        k, n, w, i, f, bi, bo, rc = line.split()
        if rc != "0":
            continue
        n = int(n)
        pts.setdefault(k, {}).setdefault(n, []).append(float(i) / 1e3)
        if bi != "-":
            bytes_[n] = (int(bi), int(bo))
    out = []
    if bytes_:
        ns = sorted(bytes_)
        for j, name in ((0, "in"), (1, "out")):
            ys = [bytes_[n][j] for n in ns]
            a, b = fit(ns, ys, [lambda x: x, lambda x: x * x])
            worst = max(abs(a * n + b * n * n - y) for n, y in zip(ns, ys))
            out.append("root bytes %s = %.1f*n + %.2f*n^2 (largest miss on the measured "
                       "points: %.0f B); at n=%d: %.3g B" % (name, a, b, worst, N,
                                                              a * N + b * N * N))
            if name == "out":
                out.append("  root writes them in %.3g s at %.3g B/s (n=%d)" %
                           ((a * N + b * N * N) / B, B, N))
        out.append("ring exchange (if these runs used it): 2 rounds of n-1 steps: %.3g s at "
                   "n=%d (hop %.0f us, record %.0f B)" % (2 * (N - 1) * (hop + rec / B), N,
                                                          hop * 1e6, rec))
    for k in sorted(pts):
        ns = sorted(pts[k])
        ys = [sorted(pts[k][n])[len(pts[k][n]) // 2] for n in ns]
        P = lambda n: n * (n - 1) / 2
        t0, wr, wp = fit(ns, ys, [lambda x: 1.0, lambda x: x / C, lambda x: P(x) / C])
        out.append("%s: T(n) = %.3f + (n*%.4f + n(n-1)/2*%.6f)/%d s" % (k, t0, wr, wp, C))
        out.append("  n    measured_s  model_s  miss")
        for n, y in zip(ns, ys):
            m = t0 + (n * wr + P(n) * wp) / C
            out.append("  %-4d %9.2f %8.2f %+5.0f%%" % (n, y, m, 100 * (m - y) / y if y else 0))
        one_host = t0 + (N * wr + P(N) * wp) / C
        cluster = t0 + R * wr / C + (N - 1) * max(wp, 0) / 2
        out.append("  n=%d on one such host: %.0f s; on %d hosts of %d ranks (%d CPUs "
                   "each): %.1f s plus the root" % (N, one_host, N // R, R, C, cluster))
    print("\n".join(out))

main()
