# hd 256's two consumer warpgroups issue freely (v17 call 5: -3 to -6% up to 2k keys, and 8 bytes of spills).
s/ForwardConfig<256, \([0-9]*\), 2, 2>/ForwardConfig<256, \1, 2, 2, IssueOrder::free>/g
