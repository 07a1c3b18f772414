"""The tools above the library: demo, bench, memory and IO models, tile sweeps, the command line.

They import the library; the library never imports them.
"""
