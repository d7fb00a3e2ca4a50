# hd 128 under a mask on the unmasked kernel's 176-key tiles
/struct KernelPlan<128, true>/,/};/ s/ForwardConfig<128, 128, 2, 2>/ForwardConfig<128, 176, 2, 2>/
