# hd 128 back on turns (the order before v17).
s/, IssueOrder::free>/>/g
