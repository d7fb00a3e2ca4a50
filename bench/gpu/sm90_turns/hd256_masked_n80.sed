# hd 256 under a mask back on 80-key tiles (the plan before v17).
s/^struct KernelPlan<256, true> : Plan<ForwardConfig<256, 64, 2, 2>> {};/struct KernelPlan<256, true> : Plan<ForwardConfig<256, 80, 2, 2>> {};/
