"""FlashMLA dense decode on one shape, four launches, for a profiler (ncu -k regex:flash_fwd_splitkv_mla
--launch-skip 2 --launch-count 1). The inputs are flashmla_decode.py's. Usage (PYTHONPATH holding a
FlashMLA build): flashmla_decode_one.py h_q b seqlen [s_q]"""
import sys, torch
from flash_mla import flash_mla_with_kvcache, get_mla_metadata
torch.manual_seed(0)
d, dv, bs = 576, 512, 64
h_q, b, seqlen = (int(x) for x in sys.argv[1:4]); s_q = int(sys.argv[4]) if len(sys.argv) > 4 else 1
lens = torch.tensor([seqlen + 2 * i for i in range(b)], dtype=torch.int32, device="cuda")
pad = (int(lens.max()) + 255) // 256 * 256
q = torch.randn(b, s_q, h_q, d, dtype=torch.bfloat16, device="cuda") / 10
table = torch.randperm(b * pad // bs, device="cuda").to(torch.int32).view(b, -1)
cache = torch.randn(table.numel(), bs, 1, d, dtype=torch.bfloat16, device="cuda") / 10
md, _ = get_mla_metadata(lens, s_q * h_q, 1)
for _ in range(4):
    flash_mla_with_kvcache(q, cache, table, lens, dv, md, None, causal=True)
torch.cuda.synchronize()
