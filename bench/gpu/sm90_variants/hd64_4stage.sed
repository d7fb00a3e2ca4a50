# hd 64: a 4-stage ring (152 KB)
s/ForwardConfig<64, 128, 3, 3>/ForwardConfig<64, 128, 3, 4>/
