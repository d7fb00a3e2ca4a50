# hd 64 on the overlapped ordering (three consumer warpgroups taking turns) instead of the serial one
/struct KernelPlan<64, kMasked>/,/};/ s/Ordering::serial/Ordering::overlapped/
