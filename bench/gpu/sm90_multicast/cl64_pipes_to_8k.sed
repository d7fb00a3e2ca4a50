# The clustered pipelines up to 8k keys, with a mask or without.
s/Hd64ShortKeysPlan, [0-9]*> {};/Hd64ShortKeysPlan, 8192> {};/
