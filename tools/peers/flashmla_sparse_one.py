"""FlashMLA sparse decode (fp8 cache) on one shape, four launches, for a profiler
(ncu -k regex:fp8_sparse --launch-skip 2 --launch-count 1). The inputs are flashmla_sparse.py's
(s_q 2, s_kv 32768 unless given, block size 64, distinct random indices). Usage (PYTHONPATH
holding a FlashMLA build): flashmla_sparse_one.py h_q b [topk [s_kv]]"""
import sys, torch
from flash_mla import flash_mla_with_kvcache, get_mla_metadata

torch.manual_seed(0)
D, DV, BS, ROW, S_Q = 576, 512, 64, 656, 2
h_q, b = int(sys.argv[1]), int(sys.argv[2])
topk = int(sys.argv[3]) if len(sys.argv) > 3 else 2048
s_kv = int(sys.argv[4]) if len(sys.argv) > 4 else 32768
per_seq = s_kv // BS
cache = torch.empty(b * s_kv, ROW, dtype=torch.uint8, device="cuda")
cache[:, :512] = (torch.randn(b * s_kv, 512, device="cuda") / 10).to(torch.float8_e4m3fn).view(torch.uint8)
cache[:, 512:528] = torch.ones(b * s_kv, 4, dtype=torch.float32, device="cuda").view(torch.uint8)
cache[:, 528:] = (torch.randn(b * s_kv, 64, device="cuda") / 10).to(torch.bfloat16).view(torch.uint8)
table = torch.randperm(b * per_seq, device="cuda").view(b, per_seq)
pos = torch.rand(b * S_Q, s_kv, device="cuda").argsort(dim=1)[:, :topk].view(b, S_Q, topk)
seq = torch.arange(b, device="cuda").view(b, 1, 1)
idx = (table[seq, pos // BS] * BS + pos % BS).to(torch.int32)
q = torch.randn(b, S_Q, h_q, D, dtype=torch.bfloat16, device="cuda") / 10
kc = cache.view(torch.float8_e4m3fn).view(b * per_seq, BS, 1, ROW)
md, _ = get_mla_metadata()
for _ in range(4):
    flash_mla_with_kvcache(q, kc, None, None, DV, md, None, D ** -0.5, False, True, idx)
torch.cuda.synchronize()
