# hd 64 under a mask on one consumer warpgroup up to 4k keys
/struct KernelPlan<64, true>/,/};/ s/Hd64MaskedShortKeysPlan, 2048>/Hd64MaskedShortKeysPlan, 4096>/
