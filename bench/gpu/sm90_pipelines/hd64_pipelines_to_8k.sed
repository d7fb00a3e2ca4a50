# Pipelines up to 8k keys.
s/Hd64ShortKeysPlan, 4096> {};/Hd64ShortKeysPlan, 8192> {};/
