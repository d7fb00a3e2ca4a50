# As hd64_2wg_6st_turns, the two warpgroups issuing freely (v17 call 5: 351).
s/using Hd64MaskedShortKeysPlan = Plan<ForwardConfig<64, 128, 1, 3>>;/using Hd64MaskedShortKeysPlan = Plan<ForwardConfig<64, 128, 2, 6, IssueOrder::free>>;/
