"""Measurement only (imports nothing above it): throughput and phase meters, FLOPs/MFU, peak memory, the memory
model and the automatic micro-batch size built on it, the profiler."""
