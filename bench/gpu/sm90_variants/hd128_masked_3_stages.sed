/struct KernelPlan<128, true>/,/};/ s/ForwardConfig<128, 128, 2, 2>/ForwardConfig<128, 128, 2, 3>/
