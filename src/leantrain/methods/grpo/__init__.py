"""GRPO, online RL on prompts: the method (``grpo``), its forward (``forward``: each prompt encoded once for its
group), losses and advantages (``losses``), reward functions (``rewards``) and the rollout's training rows (``rollout``)."""
