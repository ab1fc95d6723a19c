"""Launch: start the worker processes of a multi-process run and supervise them. ``torchrun``: the options
(``--nproc`` / ``--nnodes`` / ...), the torchrun command and ``launch()``; ``supervise``: torchrun in a session of its
own that dies with the launcher, with SIGTERM / SIGINT forwarded. Nothing is imported here, so that
``python -m leantrain.launch.supervise`` starts light."""
