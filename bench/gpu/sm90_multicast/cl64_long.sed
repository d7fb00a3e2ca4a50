# hd 64's 192-row three-warpgroup kernel in clusters of two (384-row tiles, half of each K/V tile per CTA).
s/Plan<ForwardConfig<64, 128, 3, 3>,/Plan<ForwardConfig<64, 128, 3, 3, IssueOrder::turns, 1, 2>,/
