# hd 128 with three consumer warpgroups (192 query rows: K/V streamed once per 192 rows instead of 128, a third
# less L2 traffic per FLOP) on 80-key tiles, 3 stages
/struct KernelPlan<128, false>/,/};/ s/ForwardConfig<128, 176, 2, 2>/ForwardConfig<128, 80, 3, 3>/
/struct KernelPlan<128, true>/,/};/ s/ForwardConfig<128, 128, 2, 2>/ForwardConfig<128, 80, 3, 3>/
