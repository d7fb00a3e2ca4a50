# Pipelines up to 2k keys, with a mask or without (three warpgroups on 192 x 128 blocks from there).
s/Hd64ShortKeysPlan, [0-9]*> {};/Hd64ShortKeysPlan, 2048> {};/
