"""What the benchmark scripts share: ``rounds`` (contenders interleaved over rounds, each in a fresh process),
``measure`` (step clocks, peak memory, precision), ``jobs`` (the SST-2 slice, GPT-2's tokenizer, the shared data),
``tables`` (medians, ratios, RESULTS blocks, the machine) and ``trl`` (what the comparisons with TRL add)."""
