s/kShortKeys = 4096;/kShortKeys = 0;/
