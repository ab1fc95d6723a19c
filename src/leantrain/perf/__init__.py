"""Measuring what a run costs: time, throughput, memory."""
