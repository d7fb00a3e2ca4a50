# hd 64 under a mask up to 2k keys on a52408c's plan: 128 x 128, two consumer warpgroups, 4 stages
s/using Hd64MaskedShortKeysPlan = Plan<ForwardConfig<64, 128, 1, 3>>;/using Hd64MaskedShortKeysPlan = Plan<ForwardConfig<64, 128, 2, 4>>;/
