# hd 128 with three consumer warpgroups on 80-key tiles, 3 stages, serial ordering (hd 64's)
/struct KernelPlan<128, false>/,/};/ s/ForwardConfig<128, 176, 2, 2>/ForwardConfig<128, 80, 3, 3>/
/struct KernelPlan<128, true>/,/};/ s/ForwardConfig<128, 128, 2, 2>/ForwardConfig<128, 80, 3, 3>/
/struct KernelPlan<128, /,/};/ s/Ordering::overlapped/Ordering::serial/
