"""The RL loss math as pure torch functions: policy loss, KL, importance sampling, entropy and RED.

Tensors are ``(rows, tokens)``; ``mask`` is 1 on trained tokens. A row may hold one sequence (padded) or
several packed sequences, told apart by ``segment_ids`` (sequence index per token, −1 on padding).
"""
