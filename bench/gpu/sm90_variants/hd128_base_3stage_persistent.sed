# hd 128: 128 x 128 tiles with a 3-stage ring (224 KB), masked or not, on the persistent grid (cuDNN's choice
# at hd 128 on the H200: a persistent grid, 232 KB of shared memory; sm90-notes.md, v8)
s/ForwardConfig<128, 176, 2, 2>/ForwardConfig<128, 128, 2, 3>/
s/ForwardConfig<128, 128, 2, 2>/ForwardConfig<128, 128, 2, 3>/
s/kPersistentUpToKeys = 8192;/kPersistentUpToKeys = kAlwaysPersistent;/
