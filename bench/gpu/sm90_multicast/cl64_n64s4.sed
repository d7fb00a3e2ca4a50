# hd 64's cluster pipelines on 64-key tiles with a 4-stage ring (the same 72 KB per pipeline): less diagonal waste
# under a causal mask, and a deeper ring between the two CTAs' slot releases.
s/^using Hd64ShortKeysPlan = Plan<ForwardConfig<64, 128, 1, 2, IssueOrder::free, 3, 2>>;/using Hd64ShortKeysPlan = Plan<ForwardConfig<64, 64, 1, 4, IssueOrder::free, 3, 2>>;/
