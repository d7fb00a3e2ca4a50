# hd 64 under a mask on one consumer warpgroup with 176-key tiles (2 stages: 8 KB + 2 * 44 KB = 96 KB) up to 4k keys
s/using Hd64MaskedShortKeysPlan = Plan<ForwardConfig<64, 128, 1, 3>>;/using Hd64MaskedShortKeysPlan = Plan<ForwardConfig<64, 176, 1, 2>>;/
/struct KernelPlan<64, true>/,/};/ s/Hd64MaskedShortKeysPlan, 2048>/Hd64MaskedShortKeysPlan, 4096>/
