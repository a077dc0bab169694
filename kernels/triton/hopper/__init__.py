"""The warp-specialized Gluon kernels for sm_90: forward, dK/dV, fused backward, and the layouts they share."""
