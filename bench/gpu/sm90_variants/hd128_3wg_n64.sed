# hd 128 with three consumer warpgroups on 64-key tiles, 4 stages
/struct KernelPlan<128, false>/,/};/ s/ForwardConfig<128, 176, 2, 2>/ForwardConfig<128, 64, 3, 4>/
/struct KernelPlan<128, true>/,/};/ s/ForwardConfig<128, 128, 2, 2>/ForwardConfig<128, 64, 3, 4>/
