s/Hd128ShortKeysPlan, 4096>/Hd128ShortKeysPlan, 0>/
