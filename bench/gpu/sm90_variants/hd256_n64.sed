# hd 256: 64-key tiles (192 KB)
s/ForwardConfig<256, 80, 2, 2>/ForwardConfig<256, 64, 2, 2>/
