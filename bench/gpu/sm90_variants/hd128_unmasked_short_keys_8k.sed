s/kShortKeys = 4096;/kShortKeys = 8192;/
