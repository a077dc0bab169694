"""The Triton variant kernels (windows, softcap, ALiBi, sinks, bias, block masks, varlen, paged decode), launched."""
