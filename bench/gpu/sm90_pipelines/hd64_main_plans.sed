# main's hd 64 plans before pipelines: three warpgroups on 192 x 128 blocks, and under a mask up to 2k keys two
# CTAs per SM of one warpgroup each (64 x 128, 3 stages).
s/^using Hd64ShortKeysPlan = Plan<ForwardConfig<64, 128, 1, 2, IssueOrder::free, 3>>;/using Hd64ShortKeysPlan = Plan<ForwardConfig<64, 128, 1, 3>>;/
s/^struct KernelPlan<64, false> : Plan<ForwardConfig<64, 128, 3, 3>, Hd64ShortKeysPlan, [0-9]*> {};/struct KernelPlan<64, false> : Plan<ForwardConfig<64, 128, 3, 3>> {};/
s/^struct KernelPlan<64, true> : Plan<ForwardConfig<64, 128, 3, 3>, Hd64ShortKeysPlan, [0-9]*> {};/struct KernelPlan<64, true> : Plan<ForwardConfig<64, 128, 3, 3>, Hd64ShortKeysPlan, 2048> {};/
