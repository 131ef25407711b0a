"""The peers' timing loop with a choice of L2 flush (imported by the peer scripts beside it).

triton.testing.do_bench clears the L2 before each timed call by zeroing a 256 MB buffer, which
leaves the L2 full of dirty lines that the timed call then writes back as it allocates (on an
H100 about 9 us of an 87 us decode call, docs/perf.md "Forty-fourth session"). `time_ms(f,
read=True)` is do_bench's loop written out (flush, event, call, event; median) with the buffer
read instead: the protocol of `xtask bench gemm` (by default) and `xtask bench decode
--clean-flush`. `word(read)` is what a peer file's "l2_flush" says."""
import torch

_buf = None


def time_ms(f, read, n=100, warmup=10):
    """Median ms of n calls of f, each after an L2 flush: a read of 256 MB (read) or a write."""
    global _buf
    if _buf is None:
        _buf = torch.empty(int(256e6 // 4), dtype=torch.int, device="cuda")
    flush = (lambda: _buf.sum()) if read else _buf.zero_
    for _ in range(warmup):
        flush()
        f()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for s, e in ev:
        flush()
        s.record()
        f()
        e.record()
    torch.cuda.synchronize()
    return sorted(s.elapsed_time(e) for s, e in ev)[n // 2]


def word(read):
    return "read" if read else "write"
