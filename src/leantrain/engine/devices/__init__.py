"""Where and how the run computes: the Accelerator (``accelerator``), processes and sharding (``distributed``,
``batch_layout``), the host allocator, and the efficiency switches (``efficiency``, ``dropout``)."""
