# Pipelines up to 2k keys only (three warpgroups on 192 x 128 blocks from there).
s/Hd64ShortKeysPlan, 4096> {};/Hd64ShortKeysPlan, 2048> {};/
