"""Kernel building blocks and helpers that several ops of this package share: the problem layouts
of the MaxSim kernels, tiles and TMA descriptors, the running max and the best over a document's
tiles, dot settings, output buffers, autotune timing, packed-layout moves and argument checks."""
