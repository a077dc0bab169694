"""Building the Triton kernels: the GPU aimed at, builds listed ahead, compile clock, AOT report and its SASS."""
