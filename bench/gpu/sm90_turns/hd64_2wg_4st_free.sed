# As hd64_2wg_6st_free with 4 stages (v17 call 5: 358).
s/using Hd64MaskedShortKeysPlan = Plan<ForwardConfig<64, 128, 1, 3>>;/using Hd64MaskedShortKeysPlan = Plan<ForwardConfig<64, 128, 2, 4, IssueOrder::free>>;/
