# hd 128: 128 x 128 tiles with a 3-stage ring (224 KB), masked or not
s/ForwardConfig<128, 176, 2, 2>/ForwardConfig<128, 128, 2, 3>/
s/ForwardConfig<128, 128, 2, 2>/ForwardConfig<128, 128, 2, 3>/
