"""Runs a Python script with FlashAttention-4 importable from /tmp/fa4site, where ../shared/tools/fa4-anchor installs
it on the GPU machine (bench/gpu/device_fa4_grid.sh), as a site directory so that its .pth files apply.

    python3 bench/gpu/with_fa4.py SCRIPT [args...]
"""
import runpy
import site
import sys

site.addsitedir("/tmp/fa4site")
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
