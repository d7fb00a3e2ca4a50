import torch, flashattn
from torch.profiler import profile, ProfilerActivity
for d, s in ((64, 512), (128, 512), (128, 1024), (256, 512)):
    b, h = 16384 // s, 2048 // d
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    for _ in range(5): flashattn.flash_attn_func(q, k, v, causal=True)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(10): flashattn.flash_attn_func(q, k, v, causal=True)
        torch.cuda.synchronize()
    ev = [e for e in prof.key_averages() if e.device_type.name == "CUDA" or "cuda" in str(e.device_type).lower()]
    print(f"== hd {d} S {s} causal")
    for e in sorted(prof.key_averages(), key=lambda e: -e.self_device_time_total)[:5]:
        print(f"  {e.key[:70]:70s} calls {e.count:3d} dev avg {e.self_device_time_total / max(e.count,1):9.1f} us  cpu avg {e.cpu_time_total / max(e.count,1):9.1f} us")
