"""leantrain's benchmarks, grouped by topic; never run by the test suite. Run each as a module from the repository
root (``python -m benchmarks.against.dpo_vs_trl --help``); docs/benchmarks.md lists them, results/ holds the numbers.

    driver/       what the scripts share: interleaved rounds in fresh processes, measurement, the jobs, result tables
    against/      leantrain against the HF Trainer and TRL on the same job (``<job>_vs_<tool>``)
    speed/        what each efficiency switch, fast path and optimizer costs
    memory/       peak memory: the chunked loss, token shards, evaluation, the planner against real runs
    convergence/  runs to convergence on real data (images and audio, multi-label Reuters)
    export/       GGUF export: size, time, agreement, llama.cpp itself
    probes/       the surface as a hostile user would use it, and faults injected into runs
    gpu/          the checks for a CUDA machine
"""
