"""The training loop (``loop``), its resumable state (``loop_state``), one step (``step``), and what stops a run
(``nonfinite``, ``faults``)."""
