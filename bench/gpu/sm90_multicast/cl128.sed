# Every hd 128 kernel in clusters of two.
s/ForwardConfig<128, \([0-9]*\), 2, \([23]\), IssueOrder::free>/ForwardConfig<128, \1, 2, \2, IssueOrder::free, 1, 2>/g
