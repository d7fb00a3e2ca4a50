# A/B for the device check: hd64 and hd128 with single K/V buffers (FA2's scheme, 48 / 64 KB) instead of 2 stages.
s/bucket == 64    ? ForwardTile{128, 128, 4, 2, 2}/bucket == 64    ? ForwardTile{128, 128, 4, 1, 2}/
s/bucket == 128 ? ForwardTile{128, 64, 4, 2, 2}/bucket == 128 ? ForwardTile{128, 64, 4, 1, 2}/
