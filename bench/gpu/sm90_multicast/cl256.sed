# Every hd 256 kernel in clusters of two.
s/ForwardConfig<256, \([0-9]*\), 2, 2>/ForwardConfig<256, \1, 2, 2, IssueOrder::turns, 1, 2>/g
