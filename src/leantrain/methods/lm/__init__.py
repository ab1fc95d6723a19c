"""Language modelling: causal LM pretraining and instruction tuning (``causal_lm``), the base of every method that
trains a causal LM."""
