"""The run described and prepared before training: the settings (``run_settings``), the run's description and
its checks before any worker (``run_description``, ``preflight``), the training data (``training_data``), the
precomputed columns (``precompute``), the optimizer (``optimizer_setup``), the run's parts and file (``run_parts``,
``run_file``)."""
