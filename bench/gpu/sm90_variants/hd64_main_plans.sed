# hd 64 under a mask up to 2k keys on main's plan of a52408c: 128 x 128, two consumer warpgroups, 4 stages
s/using Hd64MaskedShortKeysPlan = Plan<ForwardConfig<64, 128, 1, 3>, Ordering::overlapped>;/using Hd64MaskedShortKeysPlan = Plan<ForwardConfig<64, 128, 2, 4>, Ordering::overlapped>;/
