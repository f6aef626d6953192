"""Where a layer's tables live when no embedding engine holds them, and
what each of their updates uses (`embedding_step.py`: the step count and
learning rate, read by the engines too)."""
