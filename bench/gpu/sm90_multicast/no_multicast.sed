# hd 64's short-sequence pipelines without clusters (each CTA loads whole K / V tiles), as on main.
s/^using Hd64ShortKeysPlan = Plan<ForwardConfig<64, 128, 1, 2, IssueOrder::free, 3, 2>>;/using Hd64ShortKeysPlan = Plan<ForwardConfig<64, 128, 1, 2, IssueOrder::free, 3>>;/
