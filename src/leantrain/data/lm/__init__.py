"""Language-model data: the causal LM's token corpus (sources -> token shards on disk -> packed blocks), instruction
and chat data for supervised fine-tuning (formats, rendering with a chat template, packing) and preference data
(pairs and feedback for DPO-style tasks and reward models)."""
