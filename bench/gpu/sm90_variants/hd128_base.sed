# hd 128 without a mask: 128 x 128 tiles, 2 stages (the masked plan's kernel)
s/ForwardConfig<128, 176, 2, 2>/ForwardConfig<128, 128, 2, 2>/
