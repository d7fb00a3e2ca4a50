s/kShortKeys = 2048;/kShortKeys = 0;/
