# hd 64's cluster pipelines on 80-key tiles with a 3-stage ring (68 KB per pipeline).
s/^using Hd64ShortKeysPlan = Plan<ForwardConfig<64, 128, 1, 2, IssueOrder::free, 3, 2>>;/using Hd64ShortKeysPlan = Plan<ForwardConfig<64, 80, 1, 3, IssueOrder::free, 3, 2>>;/
