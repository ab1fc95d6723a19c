"""Measurement only (imports nothing above it): meters, FLOPs/MFU, memory, memory model, auto micro-batch, profile."""
