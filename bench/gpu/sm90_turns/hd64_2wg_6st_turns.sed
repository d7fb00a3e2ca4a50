# hd 64 masked up to 2k keys on 128 x 128 with two consumer warpgroups taking turns, 6 stages (v17 call 5: 326 at
# 2k causal against 357 for the one-warpgroup kernel).
s/using Hd64MaskedShortKeysPlan = Plan<ForwardConfig<64, 128, 1, 3>>;/using Hd64MaskedShortKeysPlan = Plan<ForwardConfig<64, 128, 2, 6>>;/
