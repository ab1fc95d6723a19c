"""GGUF export (for llama.cpp, Ollama, LM Studio) with the ``gguf`` package llama.cpp ships to Python: the
architecture's hyper-parameters and tensor names (``arch.py``), the tokenizer metadata (``vocab.py``), the file
written tensor by tensor (``write.py``), the read-back check with transformers (``check.py``) and the Ollama
``Modelfile`` (``modelfile.py``). ``gguf`` and transformers are imported by the functions that need them."""
