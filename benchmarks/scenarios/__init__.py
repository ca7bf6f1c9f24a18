"""The measurements, one module each; every one takes an open adapter and returns metrics.

Times come from ``time.perf_counter()`` (the same CLOCK_MONOTONIC in every process of the
machine, so the multi-process scenario can compare its members' timestamps).
"""
